// The sample prompt files shipped in inputs/ all parse without errors.
#include <gtest/gtest.h>

#include <set>

#include "io/request_reader.h"
#include "io_test_util.h"

namespace shardlm {
namespace {

const std::string kInputs = std::string(SHARDLM_SOURCE_DIR) + "/inputs/";

TEST(SampleInputs, PromptsJsonl) {
  const auto rs = test::read_all(kInputs + "prompts.jsonl", PromptFormat::kAuto);
  ASSERT_GE(rs.size(), 16u);
  std::set<std::string> ids;
  int with_token_ids = 0, with_overrides = 0;
  for (const auto& r : rs) {
    EXPECT_EQ(r.error, "") << "line " << r.line;
    ids.insert(r.id);
    if (r.prompt_token_ids) ++with_token_ids;
    if (r.overrides.max_tokens || r.overrides.temperature || r.overrides.seed || r.overrides.stop) ++with_overrides;
  }
  EXPECT_EQ(ids.size(), rs.size()) << "ids must be unique";
  EXPECT_GE(with_token_ids, 2);
  EXPECT_GE(with_overrides, 4);
}

TEST(SampleInputs, PromptsTxt) {
  const auto rs = test::read_all(kInputs + "prompts.txt", PromptFormat::kAuto);
  ASSERT_GE(rs.size(), 8u);
  for (const auto& r : rs) {
    EXPECT_EQ(r.error, "") << "line " << r.line;
    EXPECT_EQ(r.id, std::to_string(r.line));
  }
}

TEST(SampleInputs, OpenAiBatch) {
  const auto rs = test::read_all(kInputs + "openai_batch.jsonl", PromptFormat::kOpenAiBatch);
  ASSERT_GE(rs.size(), 4u);
  for (const auto& r : rs) {
    EXPECT_EQ(r.error, "") << "line " << r.line;
    EXPECT_EQ(r.id.rfind("request-", 0), 0u) << r.id;
  }
}

}  // namespace
}  // namespace shardlm
