// Small hand-written tokenizer.json files: merge forms, ranks, ignore_merges, unk / fuse_unk,
// added-token options, BOS from a TemplateProcessing post-processor, EOS from generation_config.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

using json = nlohmann::json;

json base_model() {
  return json{{"type", "BPE"},
              {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"<unk>", 6}}},
              {"unk_token", "<unk>"},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false}};
}

std::unique_ptr<Tokenizer> load_json(const json& root, const std::string& tag, const json& gen = json()) {
  auto dir = test::make_temp_dir(tag);
  test::write_file(dir / "tokenizer.json", root.dump());
  if (!gen.is_null()) test::write_file(dir / "generation_config.json", gen.dump());
  auto tok = Tokenizer::load(dir.string());
  std::filesystem::remove_all(dir);
  return tok;
}

json root_with(const json& model) {
  return json{{"model", model}, {"normalizer", nullptr}, {"pre_tokenizer", nullptr}, {"decoder", nullptr}};
}

TEST(TokenizerBpe, StringAndListMergesAgree) {
  auto m1 = base_model();
  m1["merges"] = {"a b", "ab c"};
  auto m2 = base_model();
  m2["merges"] = json::array({json::array({"a", "b"}), json::array({"ab", "c"})});
  auto t1 = load_json(root_with(m1), "str");
  auto t2 = load_json(root_with(m2), "list");
  EXPECT_EQ(t1->encode("abc"), std::vector<int32_t>{5});
  EXPECT_EQ(t2->encode("abc"), std::vector<int32_t>{5});
  EXPECT_EQ(t1->encode("abcab"), (std::vector<int32_t>{5, 3}));
  // Without a decoder tokens are joined with a space (Hugging Face behaviour).
  EXPECT_EQ(t1->decode({3, 2}), "ab c");
}

TEST(TokenizerBpe, LowestRankMergesFirst) {
  auto m = base_model();
  m["merges"] = {"b c", "a b", "a bc"};  // "b c" has rank 0: "abc" -> a + bc -> abc
  auto t = load_json(root_with(m), "rank");
  EXPECT_EQ(t->encode("abc"), std::vector<int32_t>{5});
  m["merges"] = {"b c", "a b"};  // no "a bc": stays a, bc
  t = load_json(root_with(m), "rank2");
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(t->encode("ab"), std::vector<int32_t>{3});
}

// A pair listed twice takes the rank of its last listing, as in Hugging Face (which collects the
// list into a map): "a b" ranks after "b c" here, so "abc" is a + bc (tokenizers 0.23: ['a', 'bc']).
TEST(TokenizerBpe, DuplicateMergeTakesItsLastRank) {
  auto m = base_model();
  m["merges"] = {"a b", "b c", "a b"};
  auto t = load_json(root_with(m), "dup");
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{0, 4}));
  m["merges"] = {"a b", "b c"};
  t = load_json(root_with(m), "nodup");
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{3, 2}));
}

// Lowercase is the full mapping (Rust's char::to_lowercase): U+0130 becomes "i" + U+0307
// (tokenizers 0.23 normalises "\u0130aI" to "i\u0307ai").
TEST(TokenizerBpe, LowercaseOfDottedCapitalIIsTwoCharacters) {
  json m = {{"type", "BPE"}, {"vocab", {{"i", 0}, {"\u0307", 1}, {"a", 2}}}, {"merges", json::array()}};
  json root = root_with(m);
  root["normalizer"] = {{"type", "Lowercase"}};
  auto t = load_json(root, "lower");
  EXPECT_EQ(t->encode("\u0130aI"), (std::vector<int32_t>{0, 1, 2, 0}));
}

// 20000 added tokens sharing their first byte load in a moment (measured: 0.03 s; 1.3 s when each
// add sorted the bucket again, growing as the square) and still match longest first.
TEST(TokenizerBpe, ManyAddedTokensLoadAndMatchLongestFirst) {
  auto m = base_model();
  m["merges"] = {"a b"};
  json root = root_with(m);
  root["added_tokens"] = json::array();
  constexpr int kAdded = 20000;
  for (int i = 0; i < kAdded; ++i)
    root["added_tokens"].push_back({{"id", 7 + i}, {"content", "<t" + std::to_string(i) + ">"}, {"special", true}});
  root["added_tokens"].push_back({{"id", 7 + kAdded}, {"content", "<t1"}, {"special", true}});
  const auto t0 = std::chrono::steady_clock::now();
  auto t = load_json(root, "many-added");
  std::printf("[ added tokens ] %d loaded in %.3f s\n", kAdded + 1,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_EQ(t->encode("ab<t19999>c<t1x<t12>"), (std::vector<int32_t>{3, 7 + 19999, 2, 7 + kAdded, 6, 7 + 12}));
  EXPECT_EQ(t->encode("<t1>"), (std::vector<int32_t>{7 + 1}));
}

TEST(TokenizerBpe, IgnoreMergesEmitsWholeVocabWord) {
  auto m = base_model();
  m["merges"] = {"a b"};
  auto t = load_json(root_with(m), "noign");
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{3, 2}));
  m["ignore_merges"] = true;
  t = load_json(root_with(m), "ign");
  EXPECT_EQ(t->encode("abc"), std::vector<int32_t>{5});
}

TEST(TokenizerBpe, UnknownCharactersAndFuseUnk) {
  auto m = base_model();
  m["merges"] = json::array();
  auto t = load_json(root_with(m), "unk");
  EXPECT_EQ(t->encode("xya"), (std::vector<int32_t>{6, 6, 0}));
  m["fuse_unk"] = true;
  t = load_json(root_with(m), "fuse");
  EXPECT_EQ(t->encode("xya"), (std::vector<int32_t>{6, 0}));
}

TEST(TokenizerBpe, AddedTokensLongestFirstAndStrip) {
  auto m = base_model();
  m["merges"] = {"a b"};
  auto root = root_with(m);
  root["added_tokens"] = {
      {{"id", 7}, {"content", "<x>"}, {"special", true}, {"normalized", false}},
      {{"id", 8}, {"content", "<x>>"}, {"special", true}, {"normalized", false}},
      {{"id", 9}, {"content", "<r>"}, {"special", false}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}}};
  root["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}};
  root["decoder"] = {{"type", "Fuse"}};
  auto t = load_json(root, "added");
  EXPECT_EQ(t->encode("ab<x>>c<x>a"), (std::vector<int32_t>{3, 8, 2, 7, 0}));
  EXPECT_EQ(t->encode("ab  <r>  c"), (std::vector<int32_t>{3, 9, 2}));
  EXPECT_EQ(t->decode({3, 8, 2}), "abc");  // special skipped
  EXPECT_EQ(t->decode({3, 8, 2}, false), "ab<x>>c");
  EXPECT_EQ(t->decode({3, 9, 2}), "ab<r>c");  // non-special added token is kept
  EXPECT_EQ(t->vocab_size(), 10);
}

// single_word added tokens as Hugging Face matches them: a word character is Rust regex's \w
// (letters and letter numbers, marks, decimal digits, '_' and '\u203f', ZWJ, circled letters; not
// '\u00b2' or '\u00bd'), and after a refused match the search goes on past it, so "b" inside a
// refused "ab" is not an added token. Every expectation is tokenizers 0.23's on this tokenizer.json.
TEST(TokenizerBpe, SingleWordAddedTokensAsHuggingFace) {
  json m = {{"type", "BPE"},
            {"vocab", {{"?", 0}, {"x", 1}, {"a", 2}, {"c", 3}}},
            {"merges", json::array()},
            {"unk_token", "?"},
            {"fuse_unk", false}};
  json root = root_with(m);
  root["added_tokens"] = {
      {{"id", 4}, {"content", "ab"}, {"special", true}, {"normalized", false}, {"single_word", true}},
      {{"id", 5}, {"content", "b"}, {"special", true}, {"normalized", false}},
      {{"id", 6}, {"content", "<w>"}, {"special", true}, {"normalized", false}, {"single_word", true}}};
  auto t = load_json(root, "single-word");
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"xab", {1, 2, 0}},          {"ab", {4}},
      {"x ab", {1, 0, 4}},         {"abx", {2, 0, 1}},
      {"xabb", {1, 2, 0, 5}},      {"c<w>", {3, 0, 0, 0}},
      {"\u00b2<w>", {0, 6}},       {"a\u0301<w>", {2, 0, 0, 0, 0}},
      {"\u203f<w>", {0, 0, 0, 0}}, {"<w>\u2160", {0, 0, 0, 0}},
      {"\u200d<w>", {0, 0, 0, 0}}, {"<w>_", {0, 0, 0, 0}},
      {"\u0663<w>", {0, 0, 0, 0}}, {"\u24b6<w>", {0, 0, 0, 0}},
      {"\u00bd<w>", {0, 6}},       {" <w> ", {0, 6, 0}}};
  for (const auto& [text, ids] : cases) EXPECT_EQ(t->encode(text), ids) << text;
}

TEST(TokenizerBpe, BosFromTemplateAndEosFromGenerationConfig) {
  auto m = base_model();
  m["merges"] = json::array();
  auto root = root_with(m);
  root["added_tokens"] = {{{"id", 7}, {"content", "<bos>"}, {"special", true}, {"normalized", false}}};
  root["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel"},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<bos>": {"id": "<bos>", "ids": [7], "tokens": ["<bos>"]}}}]})");
  auto t = load_json(root, "tmpl", json{{"eos_token_id", {6, 2}}});
  ASSERT_TRUE(t->bos_to_prepend().has_value());
  EXPECT_EQ(*t->bos_to_prepend(), 7);
  EXPECT_EQ(t->eos_ids(), (std::vector<int32_t>{6, 2}));
}

TEST(TokenizerBpe, ByteLevelWithGpt2Regex) {
  auto root = json::parse(R"({
    "model": {"type": "BPE", "vocab": {"h": 0, "i": 1, "\u0120": 2, "\u0120h": 3, "hi": 4, "\u0120hi": 5, "!": 6},
              "merges": ["h i", "\u0120 hi"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "decoder": {"type": "ByteLevel"}})");
  auto t = load_json(root, "gpt2");
  // GPT-2 regex: "hi", " hi", "!" ; space maps to U+0120.
  EXPECT_EQ(t->encode("hi hi!"), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(t->decode({4, 5, 6}), "hi hi!");
  EXPECT_EQ(t->token_bytes(5), " hi");
  root["pre_tokenizer"]["add_prefix_space"] = true;
  t = load_json(root, "gpt2p");
  EXPECT_EQ(t->encode("hi"), std::vector<int32_t>{5});
}

TEST(TokenizerBpe, MetaspacePreTokenizerAndDecoder) {
  auto root = json::parse(R"({
    "model": {"type": "BPE", "vocab": {"\u2581": 0, "a": 1, "b": 2, "\u2581a": 3, "\u2581b": 4, "\u2581\u2581a": 5},
              "merges": [["\u2581", "a"], ["\u2581", "b"], ["\u2581", "\u2581a"]]},
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true},
    "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true}})");
  auto t = load_json(root, "metaspace");
  EXPECT_EQ(t->encode("a b"), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(t->encode("ab"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(t->decode({3, 4}), "a b");
  EXPECT_EQ(t->token_bytes(4), " b");
  // Every replacement character of the first token goes, the later tokens' become spaces. Values
  // from tokenizers 0.23's Metaspace decoder on this tokenizer.json.
  EXPECT_EQ(t->decode({5, 4}), "a b");  // "\u2581\u2581a" first: both go
  EXPECT_EQ(t->decode({5, 5}), "a  a");
  EXPECT_EQ(t->decode({0, 3, 4}), " a b");
  EXPECT_EQ(t->decode({1, 0, 4}), "a  b");
  EXPECT_EQ(t->decode({4, 0, 0}), "b  ");
}

// prepend_scheme "never": nothing is dropped from the first token.
TEST(TokenizerBpe, MetaspaceDecoderWithoutPrependKeepsTheFirstSpace) {
  auto root = json::parse(R"({
    "model": {"type": "BPE", "vocab": {"\u2581": 0, "a": 1, "\u2581a": 2, "\u2581\u2581a": 3}, "merges": [["\u2581", "a"], ["\u2581", "\u2581a"]]},
    "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": true}})");
  auto t = load_json(root, "metaspace-never");
  EXPECT_EQ(t->decode({2, 0, 1}), " a a");
  EXPECT_EQ(t->decode({3, 2}), "  a a");
}

}  // namespace
}  // namespace shardlm
