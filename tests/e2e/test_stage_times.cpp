// Each pipeline stage's part of every step reaches /steps (stage_compute_s, stage_comm_s): one
// entry per stage, each part within the step's wall time, no communication on a single rank, and
// the tensor-parallel reductions and the stage hand-offs counted as communication.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/layout_check.h"
#include "common/test_files.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::Proc;
using test::sh;
using test::shardlm_bin;

struct StageRows {
  std::vector<std::vector<double>> compute, comm;
  std::vector<double> wall;
};

StageRows read_stage_rows(const std::string& path) {
  test::H5Reader h(path);
  return {h.lists<double>("/steps/stage_compute_s", H5T_NATIVE_DOUBLE),
          h.lists<double>("/steps/stage_comm_s", H5T_NATIVE_DOUBLE),
          h.scalars<double>("/steps/wall_s", H5T_NATIVE_DOUBLE)};
}

// Every row has `stages` entries, none negative, each stage's part within the step's wall time;
// returns each stage's communication seconds summed over the steps.
std::vector<double> check_rows(const StageRows& s, size_t stages, const std::string& what) {
  EXPECT_FALSE(s.wall.empty()) << what;
  EXPECT_EQ(s.compute.size(), s.wall.size()) << what;
  EXPECT_EQ(s.comm.size(), s.wall.size()) << what;
  std::vector<double> comm(stages, 0.0), compute(stages, 0.0);
  for (size_t i = 0; i < s.wall.size() && i < s.compute.size() && i < s.comm.size(); ++i) {
    EXPECT_EQ(s.compute[i].size(), stages) << what << " step " << i;
    EXPECT_EQ(s.comm[i].size(), stages) << what << " step " << i;
    if (s.compute[i].size() != stages || s.comm[i].size() != stages) continue;
    for (size_t k = 0; k < stages; ++k) {
      EXPECT_GE(s.compute[i][k], 0.0) << what << " step " << i << " stage " << k;
      EXPECT_GE(s.comm[i][k], 0.0) << what << " step " << i << " stage " << k;
      // A stage's part begins after the leader began the step and ends before the leader hears
      // of it: within the step's wall time (plus the clocks' granularity).
      EXPECT_LE(s.compute[i][k] + s.comm[i][k], s.wall[i] + 1e-4) << what << " step " << i << " stage " << k;
      comm[k] += s.comm[i][k];
      compute[k] += s.compute[i][k];
    }
  }
  for (size_t k = 0; k < stages; ++k) EXPECT_GT(compute[k], 0.0) << what << " stage " << k;
  return comm;
}

TEST(StageTimes, EveryStageOfEveryStep) {
  const fs::path d = test::fresh_dir("stage-times");
  const std::string model = (d / "m").string();
  Proc made = sh(shardlm_bin() + " make-model --config " + std::string(SHARDLM_SOURCE_DIR) +
                 "/inputs/models/tiny-llama.json --out " + model + " --seed 11");
  ASSERT_EQ(made.code, 0) << made.out;
  const std::vector<std::string> outs =
      test::check_layout_runs(model, {{3, "--pp 3"}, {4, "--pp 2 --tp 2"}, {4, "--pp 2"}}, false, "stage-times");
  ASSERT_EQ(outs.size(), 3u);

  // One rank: one stage, no communicator, so no communication at all.
  const std::string one = (fs::path(outs[0]).parent_path() / "one.h5").string();
  const std::vector<double> one_comm = check_rows(read_stage_rows(one), 1, one);
  EXPECT_EQ(one_comm[0], 0.0);

  // Stages hand their hidden states on: every stage spends time in the hand-offs (a later stage
  // waits there for its input).
  const std::vector<double> pp3 = check_rows(read_stage_rows(outs[0]), 3, outs[0]);
  for (size_t k = 0; k < 3; ++k) EXPECT_GT(pp3[k], 0.0) << "stage " << k;
  const std::vector<double> pp2tp2 = check_rows(read_stage_rows(outs[1]), 2, outs[1]);
  for (size_t k = 0; k < 2; ++k) EXPECT_GT(pp2tp2[k], 0.0) << "stage " << k;
  // Two replicas of two stages: a replica other than the writer's sends its rows to it
  // (parallel/result_messages.h; which replica claims which prompts varies from run to run).
  check_rows(read_stage_rows(outs[2]), 2, outs[2]);

  // The report shows a row per stage.
  Proc report = sh(shardlm_bin() + " report " + outs[0]);
  ASSERT_EQ(report.code, 0) << report.out;
  EXPECT_NE(report.out.find("step time by pipeline stage"), std::string::npos) << report.out;
  for (const char* stage : {"\n      0 ", "\n      1 ", "\n      2 "})
    EXPECT_NE(report.out.find(stage), std::string::npos) << report.out;
}

}  // namespace
}  // namespace shardlm
