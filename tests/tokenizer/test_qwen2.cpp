// Qwen2 byte-level BPE: the llama.cpp vocab test cases, round trips, special tokens, bad UTF-8.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "common/shared_data.h"
#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

using test::read_file;

std::unique_ptr<Tokenizer> load_qwen2(const std::string& json_path) {
  return Tokenizer::load(std::filesystem::path(json_path).parent_path().string());
}

// cases.inp: every case is followed by "\n__ggml_vocab_test__\n"; cases.out: one line of
// space-separated ids per case (llama.cpp test-tokenizer-0 format).
void read_cases(const std::string& dir, std::vector<std::string>& inputs, std::vector<std::vector<int32_t>>& outputs) {
  const std::string inp = read_file(dir + "/cases.inp"), out = read_file(dir + "/cases.out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < inp.size();) {
    size_t next = inp.find(sep, pos);
    ASSERT_NE(next, std::string::npos) << "case without separator at byte " << pos;
    inputs.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  for (size_t pos = 0; pos < out.size();) {
    size_t next = out.find('\n', pos);
    if (next == std::string::npos) next = out.size();
    outputs.push_back(test::parse_ids(out.substr(pos, next - pos)));
    pos = next + 1;
  }
}

TEST(TokenizerQwen2, LoadsWithExpectedVocabPrintingTheTime) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto t0 = std::chrono::steady_clock::now();
  auto tok = load_qwen2(path);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ qwen2 ] load: " << ms << " ms\n";
  EXPECT_EQ(tok->vocab_size(), 151646);
  EXPECT_FALSE(tok->bos_to_prepend().has_value());
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{151645});  // "<|im_end|>"
  EXPECT_TRUE(tok->is_special(151643));
  EXPECT_TRUE(tok->is_special(151645));
  EXPECT_FALSE(tok->is_special(1000));
}

TEST(TokenizerQwen2, PeerCasesEncodeExactly) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  SHARDLM_REQUIRE_SHARED(dir, "tokenizers/qwen2/peer-tests");
  auto tok = load_qwen2(path);
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> expected;
  read_cases(dir, inputs, expected);
  // The files hold 46 cases (46 separators, 46 output lines).
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(expected.size(), inputs.size());
  int exact = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto ids = tok->encode(inputs[i]);
    EXPECT_EQ(ids, expected[i]) << "case " << i << ": \"" << inputs[i] << "\"";
    exact += ids == expected[i];
    EXPECT_EQ(tok->decode(ids), inputs[i]) << "round trip of case " << i;
  }
  EXPECT_EQ(exact, 46);
}

TEST(TokenizerQwen2, KnownEncodings) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto tok = load_qwen2(path);
  // From cases.out: "Hello world" and " Hello world".
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(tok->encode(" Hello world"), (std::vector<int32_t>{21927, 1879}));
  EXPECT_EQ(tok->token_bytes(1879), " world");
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(TokenizerQwen2, SpecialTokensMatchedBeforePretokenisation) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto tok = load_qwen2(path);
  auto ids = tok->encode("<|im_start|>user\nHello world<|im_end|>\n");
  auto user = tok->encode("user\nHello world");
  std::vector<int32_t> want{151644};
  want.insert(want.end(), user.begin(), user.end());
  want.push_back(151645);
  auto nl = tok->encode("\n");
  want.insert(want.end(), nl.begin(), nl.end());
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), "<|im_start|>user\nHello world<|im_end|>\n");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), "user\nHello world\n");
}

TEST(TokenizerQwen2, InvalidUtf8IsReplacedNotFatal) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto tok = load_qwen2(path);
  // 0xFF is never valid; "\xE4\xBD" is a truncated 3-byte character (one maximal subpart).
  auto ids = tok->encode("a\xFF b\xE4\xBD");
  EXPECT_EQ(ids, tok->encode("a\xEF\xBF\xBD b\xEF\xBF\xBD"));
  EXPECT_EQ(tok->decode(ids), "a\xEF\xBF\xBD b\xEF\xBF\xBD");
}

// \s is Unicode's White_Space, as in HF's regex engine: U+180E (Mongolian vowel separator) is not
// in it. Ids from tokenizers 0.23 on the same tokenizer.json.
TEST(TokenizerQwen2, MongolianVowelSeparatorIsNotWhiteSpace) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto tok = load_qwen2(path);
  EXPECT_EQ(tok->encode("\u180e's"), (std::vector<int32_t>{123970, 236, 6, 82}));
  EXPECT_EQ(tok->encode("x \u180e!"), (std::vector<int32_t>{87, 86089, 254, 236, 0}));
  EXPECT_EQ(tok->encode("a\u180e\u180e b"), (std::vector<int32_t>{64, 123970, 236, 123970, 236, 293}));
  EXPECT_EQ(tok->encode("\u3000\u180e x"), (std::vector<int32_t>{22441, 123970, 236, 856}));
}

TEST(TokenizerQwen2, NfcNormalisation) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto tok = load_qwen2(path);
  // "e" + combining acute composes to U+00E9 before BPE.
  EXPECT_EQ(tok->encode("caf\x65\xCC\x81"), tok->encode("caf\xC3\xA9"));
}

TEST(TokenizerQwen2, LargeTextRoundTripsPrintingTheRate) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  SHARDLM_REQUIRE_SHARED(dir, "tokenizers/qwen2/peer-tests");
  auto tok = load_qwen2(path);
  const std::string base = read_file(dir + "/cases.inp");
  std::string text;
  while (text.size() < (1u << 20)) text += base;
  auto t0 = std::chrono::steady_clock::now();
  auto ids = tok->encode(text);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ qwen2 ] encode " << text.size() << " bytes -> " << ids.size() << " tokens in " << s * 1e3
            << " ms (" << text.size() / s / 1e6 << " MB/s)\n";
  EXPECT_EQ(tok->decode(ids), text);
}

}  // namespace
}  // namespace shardlm
