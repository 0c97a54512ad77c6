// Kimi K2's tiktoken tokenizer (../shared/tokenizers/kimi-k2): public vectors, the cases
// kimi_tiktoken_compare.py produced with tiktoken itself, specials, round trips, bad UTF-8, speed.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/shared_data.h"
#include "core/utf8.h"
#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

constexpr const char* kKimiDir = "tokenizers/kimi-k2";
constexpr int32_t kImEnd = 163586, kImMiddle = 163601;

std::unique_ptr<Tokenizer> load_kimi(const std::string& dir, double* ms = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::load(dir);
  if (ms) *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return tok;
}

const std::vector<std::string>& multilingual_samples() {
  static const std::vector<std::string> s = {
      "The quick brown fox jumps over the lazy dog. I'm sure they'll agree; it's what we'd've done.",
      "你好，世界！今天天气很好，我们一起去公园散步吧。机器学习模型需要大量的数据。",
      "日本語の文章です。東京は日本の首都で、カタカナやひらがなも使います。",
      "한국어 문장입니다. 서울은 대한민국의 수도입니다.",
      "مرحبا بالعالم، هذه جملة باللغة العربية للاختبار.",
      "Привет, мир! Это предложение на русском языке.",
      "Emoji: 🙂👍🏽👨‍👩‍👧‍👦🇫🇷 and digits 1234567 3.14159 2024-06-30",
      "Line one\nLine two\r\n\tIndented\n\n    spaces   and  tabs\t\t",
      "Γειά σου Κόσμε. नमस्ते दुनिया। สวัสดีชาวโลก. Ça va? Größe, naïve café.",
      "def main():\n    return {\"key\": [1, 2, 3]}  # comment\n",
  };
  return s;
}

TEST(TokenizerKimi, LoadsWithExpectedVocabPrintingTheTime) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  double ms = 0;
  auto tok = load_kimi(dir, &ms);
  std::cout << "[ kimi-k2 ] load: " << ms << " ms\n";
  EXPECT_EQ(tok->vocab_size(), 163840);
  EXPECT_FALSE(tok->bos_to_prepend().has_value());  // no add_bos_token in the config
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{163585});  // "[EOS]"
  EXPECT_TRUE(tok->is_special(163584));                    // [BOS]
  EXPECT_TRUE(tok->is_special(kImEnd));
  EXPECT_FALSE(tok->is_special(163595));  // <|tool_calls_section_begin|> is "special": false
  EXPECT_TRUE(tok->is_special(163589));   // reserved
  EXPECT_FALSE(tok->is_special(19180));
  EXPECT_EQ(tok->token_bytes(19180), "Hello");
  EXPECT_EQ(tok->token_bytes(kImMiddle), "<|im_middle|>");
  EXPECT_EQ(tok->token_bytes(163589), "<|reserved_token_163589|>");
  EXPECT_EQ(tok->token_bytes(163839), "[PAD]");
  EXPECT_EQ(tok->token_bytes(163840), "");
}

TEST(TokenizerKimi, PublicVectors) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  const std::vector<int32_t> hello = {19180, 11, 2695, 0, 220, 33845, 378, 2243, 856};
  EXPECT_EQ(tok->encode("Hello, world! 你好，世界！"), hello);
  std::vector<int32_t> chat = {kImMiddle};
  chat.insert(chat.end(), hello.begin(), hello.end());
  chat.push_back(kImEnd);
  const std::string chat_text = "<|im_middle|>Hello, world! 你好，世界！<|im_end|>";
  EXPECT_EQ(tok->encode(chat_text), chat);
  EXPECT_EQ(tok->decode(chat, /*skip_special=*/false), chat_text);
  EXPECT_EQ(tok->decode(chat), "Hello, world! 你好，世界！");
}

// kimi_k2_cases.jsonl: {"text", "ids"} per line, written by kimi_tiktoken_compare.py --write-golden
// from tiktoken itself (hand-written multilingual / edge cases and seeded random strings).
TEST(TokenizerKimi, TiktokenReferenceCases) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  std::istringstream in(test::read_file(std::string(SHARDLM_SOURCE_DIR) + "/tests/tokenizer/kimi_k2_cases.jsonl"));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string text = j.at("text").get<std::string>();
    const auto ids = j.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(text), ids) << "case " << n << ": " << j.at("text").dump();
    EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), text) << "case " << n;
    ++n;
  }
  EXPECT_GE(n, 30);
}

TEST(TokenizerKimi, SpecialsMatchedBeforeSplitting) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  // A special in the middle of a word cuts it: each side is split and merged on its own.
  std::vector<int32_t> expect = tok->encode("mid");
  expect.push_back(kImEnd);
  const auto rest = tok->encode("dle");
  expect.insert(expect.end(), rest.begin(), rest.end());
  const auto ids = tok->encode("mid<|im_end|>dle");
  EXPECT_EQ(ids, expect);
  EXPECT_NE(ids, tok->encode("middle"));
  EXPECT_EQ(tok->decode(ids), "middle");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), "mid<|im_end|>dle");
  // Reserved specials are matched by name too; non-special added tokens stay in decoded text.
  EXPECT_EQ(tok->encode("<|reserved_token_163700|>"), std::vector<int32_t>{163700});
  const auto tool = tok->encode("x<|tool_call_begin|>y");
  ASSERT_EQ(tool.size(), 3u);
  EXPECT_EQ(tool[1], 163597);
  EXPECT_EQ(tok->decode(tool), "x<|tool_call_begin|>y");
  // A near miss is plain text.
  EXPECT_EQ(tok->decode(tok->encode("<|im_end|")), "<|im_end|");
}

TEST(TokenizerKimi, MultilingualRoundTrip) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  for (const auto& s : multilingual_samples()) {
    const auto ids = tok->encode(s);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok->decode(ids), s);
    // Streaming gives the same text, holding back characters split across tokens.
    StreamDecoder sd(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    EXPECT_EQ(streamed, s);
  }
  // Contractions stay in their word's piece; digits go in groups of at most three.
  EXPECT_EQ(tok->encode("I'm").size(), 1u);
  const auto theyll = tok->encode("they'll");
  ASSERT_EQ(theyll.size(), 2u);
  EXPECT_EQ(tok->token_bytes(theyll[0]), "they");
  EXPECT_EQ(tok->token_bytes(theyll[1]), "'ll");
  const auto digits = tok->encode("1234567");
  ASSERT_EQ(digits.size(), 3u);
  EXPECT_EQ(tok->token_bytes(digits[0]), "123");
  EXPECT_EQ(tok->token_bytes(digits[2]), "7");
}

TEST(TokenizerKimi, InvalidUtf8IsReplacedNotFatal) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  // 0xFF is never valid; "\xE4\xBD" is a truncated 3-byte character (one maximal subpart).
  const auto ids = tok->encode("a\xFF b\xE4\xBD");
  EXPECT_EQ(ids, tok->encode("a\xEF\xBF\xBD b\xEF\xBF\xBD"));
  EXPECT_EQ(tok->decode(ids), "a\xEF\xBF\xBD b\xEF\xBF\xBD");
  // A rare emoji is several byte-level tokens; its first token alone is a truncated character,
  // which decodes to U+FFFD.
  const auto emoji = tok->encode("\xF0\x9F\x99\xA4");  // U+1F664
  ASSERT_GT(emoji.size(), 1u);
  EXPECT_EQ(tok->decode({emoji[0]}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode(emoji), "\xF0\x9F\x99\xA4");
}

// Arbitrary id sequences (byte tokens that split characters, specials, out-of-range ids): decoding
// gives valid UTF-8 and streaming gives the same text.
TEST(TokenizerKimi, RandomIdsDecodeAndStream) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids(rng() % 40);
    for (auto& id : ids) {
      const unsigned kind = rng() % 8;
      if (kind == 0) id = static_cast<int32_t>(163584 + rng() % 300);  // specials and beyond the vocab
      else if (kind == 1) id = static_cast<int32_t>(rng() % 256);      // single bytes
      else id = static_cast<int32_t>(rng() % 163584);
    }
    for (bool skip : {true, false}) {
      const std::string text = tok->decode(ids, skip);
      EXPECT_TRUE(is_valid_utf8(text));
      StreamDecoder sd(*tok, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += sd.push(id);
      streamed += sd.flush();
      EXPECT_EQ(streamed, text) << "round " << round;
    }
  }
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Kimi's TikTokenTokenizer.encode feeds tiktoken at most 400,000 characters at a time and cuts runs
// of more than 25,000 (non-)whitespace characters; the cuts show in the ids.
TEST(TokenizerKimi, LongInputsAreCutLikeKimi) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  std::string run;  // 27,300 non-space characters; the cut after 25,000 falls inside "abcde"
  while (run.size() < 27300) run += "abcde1,";
  const auto run_ids = tok->encode(run);
  EXPECT_EQ(run_ids, concat(tok->encode(run.substr(0, 25000)), tok->encode(run.substr(25000))));
  EXPECT_EQ(tok->decode(run_ids), run);
  std::string accents;  // characters, not bytes, are counted
  for (int i = 0; i < 26000; ++i) accents += "\xC3\xA9";
  EXPECT_EQ(tok->encode(accents), concat(tok->encode(accents.substr(0, 50000)), tok->encode(accents.substr(50000))));
  std::string words;  // 400,008 characters in short runs; the chunk ends inside "hello"
  while (words.size() < 400008) words += "hello world ";
  const auto words_ids = tok->encode(words);
  EXPECT_EQ(words_ids, concat(tok->encode(words.substr(0, 400000)), tok->encode(words.substr(400000))));
  EXPECT_EQ(tok->decode(words_ids), words);
  // A special token starts a fresh count.
  const std::string half = run.substr(0, 20000);
  const auto half_ids = tok->encode(half);
  EXPECT_EQ(tok->encode(half + "<|im_end|>" + half), concat(concat(half_ids, {kImEnd}), half_ids));
}

TEST(TokenizerKimi, LargeMultilingualTextRoundTripsPrintingTheRate) {
  SHARDLM_REQUIRE_SHARED(dir, kKimiDir);
  auto tok = load_kimi(dir);
  // ~4 MB of varied text: samples cut at random word boundaries, mixed with random numbers.
  std::mt19937 rng(7);
  const auto& samples = multilingual_samples();
  std::string text;
  while (text.size() < (4u << 20)) {
    const std::string& s = samples[rng() % samples.size()];
    const size_t cut = s.find(' ', rng() % s.size());
    text.append(s, 0, cut == std::string::npos ? s.size() : cut);
    text += ' ';
    text += std::to_string(rng() % 100000);
    text += rng() % 4 ? " " : "\n";
  }
  auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ kimi-k2 ] encode " << text.size() << " bytes -> " << ids.size() << " tokens in " << s * 1e3
            << " ms (" << text.size() / s / 1e6 << " MB/s)\n";
  EXPECT_EQ(tok->decode(ids), text);
}

}  // namespace
}  // namespace shardlm
