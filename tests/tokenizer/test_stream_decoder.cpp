// StreamDecoder: pushing ids one at a time reproduces decode() and never splits a character.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/shared_data.h"
#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {
namespace {

// Streams ids; returns the concatenation and checks every piece is valid UTF-8.
std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special, int* empty_pushes) {
  StreamDecoder sd(tok, skip_special);
  std::string all;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    EXPECT_TRUE(is_valid_utf8(piece)) << "invalid UTF-8 piece after id " << id;
    if (piece.empty() && empty_pushes) ++*empty_pushes;
    all += piece;
  }
  std::string rest = sd.flush();
  EXPECT_TRUE(is_valid_utf8(rest));
  return all + rest;
}

const char* kMultilingual =
    "Hello, world! Café crème brûlée, naïve résumé.\n"
    "你好，世界！ 我们在学习分词器。\n"
    "Emoji: 😀🚀👨‍👩‍👧 🦙🌍! Привет ការ 𝔸𝕓 αβγ";

TEST(StreamDecoder, Qwen2MultilingualMatchesDecode) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto tok = Tokenizer::load(std::filesystem::path(path).parent_path().string());
  auto ids = tok->encode(kMultilingual);
  ASSERT_EQ(tok->decode(ids), kMultilingual);
  int held = 0;
  EXPECT_EQ(stream_all(*tok, ids, true, &held), tok->decode(ids));
  // Some emoji / CJK characters span two byte-level tokens, so at least one push is held back.
  EXPECT_GT(held, 0);
  // Special tokens kept / skipped.
  std::vector<int32_t> with_special{151644};
  with_special.insert(with_special.end(), ids.begin(), ids.end());
  with_special.push_back(151645);
  EXPECT_EQ(stream_all(*tok, with_special, false, nullptr), tok->decode(with_special, false));
  EXPECT_EQ(stream_all(*tok, with_special, true, nullptr), tok->decode(with_special, true));
}

TEST(StreamDecoder, ByteFallbackCharacterSplitAcrossTokens) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto tok = Tokenizer::load(dir);
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(410), "");                   // "▁" alone: leading space stripped at start
  EXPECT_EQ(sd.push(3 + 0xE4), "");              // first byte of 你: held
  EXPECT_EQ(sd.push(3 + 0xBD), "");              // second byte: held
  EXPECT_EQ(sd.push(3 + 0xA0), "\xE4\xBD\xA0");  // completes 你
  EXPECT_EQ(sd.push(407), " upon");
  EXPECT_EQ(sd.push(3 + 0xE5), "");              // incomplete at the end
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");         // flushed as U+FFFD, as decode() does
  EXPECT_EQ(tok->decode({410, 3 + 0xE4, 3 + 0xBD, 3 + 0xA0, 407, 3 + 0xE5}), "\xE4\xBD\xA0 upon\xEF\xBF\xBD");
}

// A U+FFFD that no later byte can change goes out at once: one the model writes as a character
// (Qwen2's token 5691 is "\uFFFD") and a byte that cannot begin a character (a lone continuation
// byte, 0x80). Held until the run ended before, each push decoding a longer window.
TEST(StreamDecoder, FinalReplacementCharactersAreNotHeld) {
  SHARDLM_REQUIRE_SHARED(path, "tokenizers/qwen2/tokenizer.json");
  auto qwen = Tokenizer::load(std::filesystem::path(path).parent_path().string());
  ASSERT_EQ(qwen->decode({5691}), "\xEF\xBF\xBD");
  StreamDecoder sd(*qwen);
  EXPECT_EQ(sd.push(64), "a");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sd.push(5691), "\xEF\xBF\xBD") << "push " << i;
  EXPECT_EQ(sd.push(293), " b");
  EXPECT_EQ(sd.flush(), "");
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto stories = Tokenizer::load(dir);
  StreamDecoder bytes(*stories);
  EXPECT_EQ(bytes.push(3 + 0xE4), "");  // may begin a character: held
  EXPECT_EQ(bytes.push(3 + 0x41),
            "\xEF\xBF\xBD"
            "A");                                   // "A" ends it: both out
  EXPECT_EQ(bytes.push(3 + 0x80), "\xEF\xBF\xBD");  // begins nothing: out at once
  EXPECT_EQ(bytes.push(3 + 0xF0), "");              // may begin one
  EXPECT_EQ(bytes.push(3 + 0x9F), "");              // still may
  EXPECT_EQ(bytes.push(3 + 0x98), "");
  EXPECT_EQ(bytes.push(3 + 0x80), "\xF0\x9F\x98\x80");  // U+1F600
  // A bad lead, then the lead of a character the next bytes complete (found by fuzz_tokenizer):
  // the stream is decode()'s text, U+FFFD, U+4861 and seven U+FFFD.
  const std::vector<int32_t> ids = {3 + 0xD5, -1,       3 + 0xE4, 3 + 0xA1, 3 + 0xA1, 3 + 0xA1,
                                    3 + 0xA1, 3 + 0xA1, 3 + 0xA1, 3 + 0xA1, 3 + 0xC1, 3 + 0xDA};
  std::string want = "\xEF\xBF\xBD\xE4\xA1\xA1";
  for (int i = 0; i < 7; ++i) want += "\xEF\xBF\xBD";
  EXPECT_EQ(stories->decode(ids), want);
  EXPECT_EQ(stream_all(*stories, ids, true, nullptr), want);
}

TEST(StreamDecoder, StoriesGreedyOutputStreams) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto tok = Tokenizer::load(dir);
  auto ids = test::parse_ids(test::read_file(dir + "/expected_greedy_from_bos.ids"));
  std::vector<int32_t> with_bos{1};
  with_bos.insert(with_bos.end(), ids.begin(), ids.end());
  EXPECT_EQ(stream_all(*tok, with_bos, true, nullptr), test::read_file(dir + "/expected_greedy_from_bos.txt"));
  const std::string mixed = "Lily said \xE4\xBD\xA0\xE5\xA5\xBD to the cat \xF0\x9F\x90\xB1.";
  EXPECT_EQ(stream_all(*tok, tok->encode(mixed), true, nullptr), mixed);
}

// Primed with the prompt's tail, the first output word keeps its SentencePiece space, as in vLLM
// (" there" after "Once upon a time,": plain decode() of the output gives "there"). The tail is
// vLLM's: the whole prompt up to 4 tokens, else the shortest suffix from 4 on without U+FFFD.
TEST(StreamDecoder, PrimedWithThePromptKeepsTheFirstSpace) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto tok = Tokenizer::load(dir);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432};  // BOS "Once upon a time,"
  EXPECT_EQ(tok->decode({383, 286}), "there was");
  StreamDecoder sd(*tok);
  sd.prime(detokenization_context(*tok, prompt));
  EXPECT_EQ(sd.push(383), " there");
  EXPECT_EQ(sd.push(286), " was");
  // BOS alone is all the context there is: the first word has no space before it (as in vLLM).
  StreamDecoder bos(*tok);
  bos.prime(detokenization_context(*tok, {1}));
  EXPECT_EQ(bos.push(403), "Once");

  EXPECT_EQ(detokenization_context(*tok, {1, 403, 407}), (std::vector<int32_t>{1, 403, 407}));
  EXPECT_EQ(detokenization_context(*tok, prompt), (std::vector<int32_t>{407, 261, 378, 432}));
  // A suffix that starts inside a character (the continuation bytes of U+4F60) is passed over.
  const std::vector<int32_t> cut = {403, 3 + 0xE4, 3 + 0xBD, 3 + 0xA0, 407, 261};
  EXPECT_EQ(detokenization_context(*tok, cut), (std::vector<int32_t>{3 + 0xE4, 3 + 0xBD, 3 + 0xA0, 407, 261}));
}

}  // namespace
}  // namespace shardlm
