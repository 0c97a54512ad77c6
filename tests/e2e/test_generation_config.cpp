// --generation-config: the sampling defaults of a model's generation_config.json, as vLLM takes them.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/shared_data.h"
#include "common/test_files.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::Proc;
using test::sh;

// --generation-config auto (vLLM's default): the sampling fields of the model's
// generation_config.json are the defaults of the options the run does not give; a request's own
// fields still win; the repetition penalty is taken as vLLM takes it, the presence and frequency
// penalties vLLM does not read from the file are named; none ignores the file.
TEST(GenerationConfig, AutoSetsTheSamplingDefaults) {
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
  fs::path d = test::fresh_dir("generation-config");
  fs::path model = d / "m";
  fs::create_directories(model);
  for (const auto& entry : fs::directory_iterator(stories))
    if (entry.path().filename() != "generation_config.json")
      fs::create_symlink(entry.path(), model / entry.path().filename());
  test::write_file(model / "generation_config.json",
                   R"({"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.8, "top_k": 5,
                       "max_new_tokens": 7, "repetition_penalty": 1.1, "presence_penalty": 0.3})");
  test::write_file(d / "p.jsonl",
                   "{\"id\": \"a\", \"prompt\": \"Once upon a time\", \"ignore_eos\": true}\n"
                   "{\"id\": \"b\", \"prompt\": \"Lily\", \"max_tokens\": 3, \"ignore_eos\": true}\n");
  const std::string common =
      test::shardlm_bin() + " run --model " + model.string() + " --prompts " + (d / "p.jsonl").string();
  auto outputs = [](const fs::path& h5) {
    test::H5Reader h(h5);
    std::map<std::string, std::vector<int32_t>> out;
    const auto ids = h.strings("/requests/id");
    const auto toks = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    for (size_t i = 0; i < ids.size(); ++i) out[ids[i]] = toks[i];
    return out;
  };

  Proc autod = sh(common + " --generation-config auto --out " + (d / "auto.h5").string());
  ASSERT_EQ(autod.code, 0) << autod.out;
  EXPECT_NE(autod.out.find("sampling defaults from " + (model / "generation_config.json").string() +
                           ": temperature 0.8, top-k 5, repetition-penalty 1.1, max-new-tokens 7 "
                           "(--generation-config auto)"),
            std::string::npos)
      << autod.out;
  const std::string penalty = "warning: " + (model / "generation_config.json").string() +
                              " asks for presence_penalty 0.3, which is not read from it (as in vLLM)";
  EXPECT_NE(autod.out.find(penalty), std::string::npos) << autod.out;
  const auto got = outputs(d / "auto.h5");
  EXPECT_EQ(got.at("a").size(), 7u);
  EXPECT_EQ(got.at("b").size(), 3u);
  const std::string config = test::H5Reader(d / "auto.h5").string_attr("config");
  for (const char* line :
       {"temperature = 0.8", "top-k = 5", "repetition-penalty = 1.1", "max-new-tokens = 7", "generation-config = auto"})
    EXPECT_NE(config.find(line), std::string::npos) << line << " not in\n" << config;

  // The same options given by hand draw the same tokens.
  Proc by_hand = sh(common + " --temperature 0.8 --top-k 5 --repetition-penalty 1.1 --max-new-tokens 7 -q --out " +
                    (d / "hand.h5").string());
  ASSERT_EQ(by_hand.code, 0) << by_hand.out;
  EXPECT_EQ(outputs(d / "hand.h5"), got);

  // An option the run gives wins over the file; without auto the file's sampling fields are not read.
  Proc greedy = sh(common + " --generation-config auto --temperature 0 -q --out " + (d / "greedy.h5").string());
  ASSERT_EQ(greedy.code, 0) << greedy.out;
  EXPECT_NE(greedy.out.find(penalty), std::string::npos) << "the warning is said under -q too:\n" << greedy.out;
  Proc plain = sh(common + " --max-new-tokens 7 --repetition-penalty 1.1 -q --out " + (d / "plain.h5").string());
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(outputs(d / "greedy.h5"), outputs(d / "plain.h5"));
  EXPECT_NE(test::H5Reader(d / "greedy.h5").string_attr("config").find("temperature = 0\n"), std::string::npos);
  EXPECT_NE(outputs(d / "plain.h5"), got);

  test::write_file(model / "generation_config.json", R"({"temperature": "hot"})");
  Proc bad = sh(common + " --generation-config auto --out " + (d / "bad.h5").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("generation_config.json: field 'temperature' must be a number, got \"hot\""),
            std::string::npos)
      << bad.out;
}

}  // namespace
}  // namespace shardlm
