// Loading errors name the offending file.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

std::string load_error(const std::string& dir) {
  try {
    Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(TokenizerErrors, MissingTokenizerJsonNamesPath) {
  auto dir = test::make_temp_dir("missing");
  const std::string msg = load_error(dir.string());
  EXPECT_NE(msg.find((dir / "tokenizer.json").string()), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(TokenizerErrors, MalformedJsonNamesFile) {
  auto dir = test::make_temp_dir("malformed");
  test::write_file(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,,}}");
  const std::string msg = load_error(dir.string());
  EXPECT_NE(msg.find((dir / "tokenizer.json").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(TokenizerErrors, UnsupportedModelAndMalformedConfigNameFile) {
  auto dir = test::make_temp_dir("unsupported");
  test::write_file(dir / "tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  std::string msg = load_error(dir.string());
  EXPECT_NE(msg.find("Unigram"), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir / "tokenizer.json").string()), std::string::npos) << msg;

  test::write_file(dir / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  test::write_file(dir / "tokenizer_config.json", "{ not json");
  msg = load_error(dir.string());
  EXPECT_NE(msg.find((dir / "tokenizer_config.json").string()), std::string::npos) << msg;

  test::write_file(dir / "tokenizer_config.json", "{}");
  test::write_file(dir / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a z"]}})");
  msg = load_error(dir.string());
  EXPECT_NE(msg.find("not in the vocab"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardlm
