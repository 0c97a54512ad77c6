// stories260K: SentencePiece-style BPE (Prepend/Replace normaliser, byte fallback, Strip decoder).
#include <gtest/gtest.h>

#include <filesystem>

#include "common/shared_data.h"
#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

TEST(TokenizerStories, PromptEncodesLikeLlama2c) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto tok = Tokenizer::load(dir);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->encode("Once upon a time"), (std::vector<int32_t>{403, 407, 261, 378}));
  ASSERT_TRUE(tok->bos_to_prepend().has_value());
  EXPECT_EQ(*tok->bos_to_prepend(), 1);
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{2});
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(403));
}

TEST(TokenizerStories, DecodesReferenceGreedyOutput) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto tok = Tokenizer::load(dir);
  auto ids = test::parse_ids(test::read_file(dir + "/expected_greedy_from_bos.ids"));
  ASSERT_EQ(ids.size(), 200u);
  const std::string want = test::read_file(dir + "/expected_greedy_from_bos.txt");
  EXPECT_EQ(tok->decode(ids), want);
  // With BOS in front: skipped as special, and the first word still loses its leading space.
  std::vector<int32_t> with_bos{1};
  with_bos.insert(with_bos.end(), ids.begin(), ids.end());
  EXPECT_EQ(tok->decode(with_bos), want);
  EXPECT_EQ(tok->decode(with_bos, /*skip_special=*/false), "<s> " + want);
  // Round trip of the text.
  EXPECT_EQ(tok->decode(tok->encode(want)), want);
  // Non-first token keeps its space.
  EXPECT_EQ(tok->token_bytes(407), " upon");
  EXPECT_EQ(tok->decode({407}), "upon");
}

TEST(TokenizerStories, ByteFallbackForCharactersOutsideVocab) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto tok = Tokenizer::load(dir);
  // "▁" (410) then the six UTF-8 bytes of 你好 as <0xNN> tokens (id = 3 + byte).
  auto ids = tok->encode("\xE4\xBD\xA0\xE5\xA5\xBD");
  EXPECT_EQ(ids, (std::vector<int32_t>{410, 3 + 0xE4, 3 + 0xBD, 3 + 0xA0, 3 + 0xE5, 3 + 0xA5, 3 + 0xBD}));
  EXPECT_EQ(tok->decode(ids), "\xE4\xBD\xA0\xE5\xA5\xBD");
  EXPECT_EQ(tok->token_bytes(3 + 0xE4), "\xE4");
  const std::string mixed = "Lily said \xE4\xBD\xA0\xE5\xA5\xBD to the cat \xF0\x9F\x90\xB1.";
  EXPECT_EQ(tok->decode(tok->encode(mixed)), mixed);
}

}  // namespace
}  // namespace shardlm
