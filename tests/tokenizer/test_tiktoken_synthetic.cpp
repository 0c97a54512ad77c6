// tiktoken.model loading on small files written to a temp dir: rank-ordered byte-pair merging,
// reserved specials, loader choice, and errors that name the file and line.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

std::string base64(const std::string& bytes) {
  static const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t w = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) w |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) w |= static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(w >> 18) & 63];
    out += kAlphabet[(w >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(w >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[w & 63] : '=';
  }
  return out;
}

// Ranks 0..255: the single bytes; then `merged` from rank 256 on.
std::string model_text(const std::vector<std::string>& merged) {
  std::string text;
  for (int b = 0; b < 256; ++b) text += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  for (size_t i = 0; i < merged.size(); ++i) text += base64(merged[i]) + " " + std::to_string(256 + i) + "\n";
  return text;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) : path(test::make_temp_dir(tag)) {}
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::string load_error(const std::filesystem::path& dir) {
  try {
    Tokenizer::load(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(TiktokenSynthetic, MergesLowestRankFirstLeftmostOnTies) {
  TempDir d("tt_merge");
  // Ranks: 256 "bc", 257 "ab", 258 "cd", 259 "aa", 260 "aaa".
  test::write_file(d.path / "tiktoken.model", model_text({"bc", "ab", "cd", "aa", "aaa"}));
  auto tok = Tokenizer::load(d.path.string());
  EXPECT_EQ(tok->vocab_size(), 261 + 256);
  // A piece that is a token is that token.
  EXPECT_EQ(tok->encode("cd"), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok->encode("aaa"), (std::vector<int32_t>{260}));
  // "abcd": "bc" (256) merges before "ab" (257) and "cd" (258); "abc" and "bcd" are no tokens.
  EXPECT_EQ(tok->encode("abcd"), (std::vector<int32_t>{'a', 256, 'd'}));
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{'a', 256}));
  // "aaaa": "aa" at 0, 1 and 2 tie; the leftmost merges first, then "aa" at 2 (259) before "aaa"
  // (260); "aaaa" is no token.
  EXPECT_EQ(tok->encode("aaaa"), (std::vector<int32_t>{259, 259}));
  // "aaaaa": [aa a a a] -> [aa aa a] -> [aa aaa].
  EXPECT_EQ(tok->encode("aaaaa"), (std::vector<int32_t>{259, 260}));
  EXPECT_EQ(tok->decode(tok->encode("abcd aaaaa")), "abcd aaaaa");
}

TEST(TiktokenSynthetic, ReservedSpecialsAndConfig) {
  TempDir d("tt_specials");
  test::write_file(d.path / "tiktoken.model", model_text({"ab"}));
  test::write_file(d.path / "tokenizer_config.json", R"({
    "added_tokens_decoder": {
      "257": {"content": "<s>", "special": true},
      "258": {"content": "<tool>", "special": false}},
    "bos_token": "<s>", "add_bos_token": true, "eos_token": {"content": "<|reserved_token_300|>"}})");
  test::write_file(d.path / "generation_config.json", R"({"eos_token_id": [258, 300]})");
  auto tok = Tokenizer::load(d.path.string());
  EXPECT_EQ(tok->vocab_size(), 257 + 256);
  EXPECT_EQ(tok->bos_to_prepend(), std::optional<int32_t>(257));
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{300, 258}));
  EXPECT_TRUE(tok->is_special(257));
  EXPECT_FALSE(tok->is_special(258));
  EXPECT_TRUE(tok->is_special(259));
  EXPECT_FALSE(tok->is_special(256));
  EXPECT_EQ(tok->token_bytes(259), "<|reserved_token_259|>");
  EXPECT_EQ(tok->token_bytes(256), "ab");
  EXPECT_EQ(tok->token_bytes(513), "");
  const std::vector<int32_t> ids = tok->encode("ab<s>x<tool><|reserved_token_512|>");
  EXPECT_EQ(ids, (std::vector<int32_t>{256, 257, 'x', 258, 512}));
  EXPECT_EQ(tok->decode(ids), "abx<tool>");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), "ab<s>x<tool><|reserved_token_512|>");
  // Ids outside the vocabulary are skipped.
  EXPECT_EQ(tok->decode({-1, 256, 513, 100000}), "ab");
}

TEST(TiktokenSynthetic, TokenizerJsonWinsOverTiktokenModel) {
  TempDir d("tt_choice");
  test::write_file(d.path / "tiktoken.model", model_text({}));
  test::write_file(d.path / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  EXPECT_EQ(Tokenizer::load(d.path.string())->vocab_size(), 1);
  std::filesystem::remove(d.path / "tokenizer.json");
  EXPECT_EQ(Tokenizer::load(d.path.string())->vocab_size(), 512);
}

TEST(TiktokenSynthetic, MissingFilesNameBoth) {
  TempDir d("tt_missing");
  const std::string msg = load_error(d.path);
  EXPECT_NE(msg.find((d.path / "tokenizer.json").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find((d.path / "tiktoken.model").string()), std::string::npos) << msg;
}

TEST(TiktokenSynthetic, MalformedModelErrorsNameFileAndLine) {
  TempDir d("tt_bad");
  const std::string file = (d.path / "tiktoken.model").string();
  const std::string good = model_text({"ab", "cd"});  // 258 lines
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {good + "!!notbase64 258\n", file + ":259: token \"!!notbase64\" is not valid base64"},
      {good + "YWJj\n", file + ":259: expected \"<base64 token> <rank>\""},
      {good + "YWJj 25x\n", file + ":259: rank \"25x\" is not an integer"},
      {good + "YWJj -1\n", file + ":259: rank \"-1\" is not an integer"},
      {good + "YWJj 257\n", file + ":259: duplicate rank 257 (also on line 258)"},
      {good + "YWJj 300\n", file + ":259: rank 300 is out of range: the file has 259 tokens"},
      {good + "YWI= 258\n", file + ":259: duplicate token: rank 258 has the same bytes as rank 256 (line 257)"},
      {good.substr(good.find('\n') + 1) + "YWJj 0\n", file + ": byte 0x0 is not a token"},
      {"", file + ": no tokens"},
  };
  for (const auto& c : cases) {
    test::write_file(file, c.text);
    const std::string msg = load_error(d.path);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "expected \"" << c.expect << "\" in \"" << msg << "\"";
  }
  // Blank lines and CRLF endings are accepted (tiktoken skips blank lines); numbering counts them.
  std::string crlf;
  for (char ch : good) crlf += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
  test::write_file(file, "\n" + crlf + "\n");
  EXPECT_EQ(load_error(d.path), "<no error>");
  test::write_file(file, "\n" + good + "??? 258\n");
  EXPECT_NE(load_error(d.path).find(file + ":260:"), std::string::npos) << load_error(d.path);
}

TEST(TiktokenSynthetic, BadConfigNamesFile) {
  TempDir d("tt_badcfg");
  test::write_file(d.path / "tiktoken.model", model_text({}));
  const std::string cfg = (d.path / "tokenizer_config.json").string();
  struct Case {
    std::string json, expect;
  };
  const std::vector<Case> cases = {
      {"{ nope", cfg + ": malformed JSON"},
      {R"({"added_tokens_decoder": {"12": {"content": "<x>"}}})", cfg + ": special token \"<x>\" has id 12"},
      {R"({"added_tokens_decoder": {"x1": {"content": "<x>"}}})", cfg + ": \"added_tokens_decoder\" key \"x1\""},
      {R"({"added_tokens_decoder": {"300": {"special": true}}})",
       cfg + ": malformed entry in \"added_tokens_decoder\" (id 300)"},
      {R"({"added_tokens_decoder": {"256": {"content": "<|reserved_token_257|>"}}})",
       cfg + ": special tokens 256 and 257 are both \"<|reserved_token_257|>\""},
      {R"({"eos_token": "<nope>"})", cfg + ": eos_token \"<nope>\" is not in the vocabulary"},
  };
  for (const auto& c : cases) {
    test::write_file(cfg, c.json);
    const std::string msg = load_error(d.path);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "expected \"" << c.expect << "\" in \"" << msg << "\"";
  }
}

}  // namespace
}  // namespace shardlm
