// shardlm report on real runs: the reference model (its counts against the run's own attributes),
// then tiny random-weight models, a Mixtral-shaped MoE model over 2 ranks (--dp 2 --ep 2), whose
// mixture-of-experts figures must agree with sums taken from the file here, and a dense model,
// whose report must have no MoE section.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/shared_data.h"
#include "report/report_summary.h"
#include "report/result_file.h"
#include "report_sample.h"

using shardlm::test::fresh_dir;
using shardlm::test::mpirun;
using shardlm::test::sh;
using shardlm::test::shardlm_bin;

namespace shardlm::report {
namespace {

// A real run on the reference model: the report's counts and the run's own attributes agree.
TEST(ReportOfRealRun, AgreesWithTheRunsAttributes) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  const fs::path dir = fresh_dir("report-run");
  const std::string out = (dir / "r.h5").string();
  const auto run = sh(std::string(SHARDLM_BINARY) + " run --quiet --model " + model + " --prompts " +
                      SHARDLM_SOURCE_DIR "/inputs/prompts.jsonl --out " + out);
  ASSERT_EQ(run.code, 0) << run.out;
  const RunData d = load_run(out);
  const ReportSummary s = summarize(d);
  EXPECT_EQ(s.requests, d.attrs.at("requests").get<int64_t>());
  EXPECT_EQ(s.errors, d.attrs.at("request_errors").get<int64_t>());
  EXPECT_EQ(s.output_tokens, d.attrs.at("output_tokens").get<int64_t>());
  EXPECT_EQ(s.steps, d.attrs.at("steps").get<int64_t>());
  EXPECT_NEAR(s.ttft.p50, d.attrs.at("ttft_p50_s").get<double>(), 1e-9);
  EXPECT_NEAR(s.tpot.p99, d.attrs.at("tpot_p99_s").get<double>(), 1e-9);
  EXPECT_NEAR(s.output_tokens_per_s, d.attrs.at("output_tokens_per_s").get<double>(), 1e-6);
  EXPECT_EQ(s.ranks.size(), 1u);
  EXPECT_TRUE(s.finished);
  fs::remove_all(dir);
}

// Real runs of tiny random-weight models, made and run once for the suite: Mixtral's shape (8
// experts, 2 per token, 3 MoE layers) over 2 ranks with --dp 2 --ep 2, and Llama's (dense).
class ReportOfModelRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fresh_dir("report-moe"));
    const std::string prompts = SHARDLM_SOURCE_DIR "/inputs/prompts.jsonl";
    auto make = [&](const std::string& config) {
      const std::string model = (*dir_ / config).string();
      const auto p = sh(shardlm_bin() + " make-model --config " SHARDLM_SOURCE_DIR "/inputs/models/" + config +
                        ".json --out " + model + " --dtype bf16");
      return p.code == 0 ? model : "make-model " + config + " failed:\n" + p.out;
    };
    moe_model_ = new std::string(make("tiny-mixtral"));
    dense_model_ = new std::string(make("tiny-llama"));
    moe_ = new std::string((*dir_ / "moe.h5").string());
    dense_ = new std::string((*dir_ / "dense.h5").string());
    moe_run_ = new test::Proc(sh(mpirun(2) + shardlm_bin() + " run --model " + *moe_model_ + " --prompts " + prompts +
                                 " --out " + *moe_ + " --dp 2 --ep 2 -q --threads 1"));
    dense_run_ = new test::Proc(sh(shardlm_bin() + " run --model " + *dense_model_ + " --prompts " + prompts +
                                   " --out " + *dense_ + " -q --threads 1"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete moe_model_;
    delete dense_model_;
    delete moe_;
    delete dense_;
    delete moe_run_;
    delete dense_run_;
  }
  void SetUp() override {
    ASSERT_EQ(moe_run_->code, 0) << *moe_model_ << "\n" << moe_run_->out;
    ASSERT_EQ(dense_run_->code, 0) << *dense_model_ << "\n" << dense_run_->out;
  }
  static std::string report(const std::string& args) { return shardlm_bin() + " report " + args; }

  static inline fs::path* dir_ = nullptr;
  static inline std::string *moe_model_ = nullptr, *dense_model_ = nullptr, *moe_ = nullptr, *dense_ = nullptr;
  static inline test::Proc *moe_run_ = nullptr, *dense_run_ = nullptr;
};

// The summary's MoE figures against sums taken here from the columns, read with the tests' own
// HDF5 reader.
TEST_F(ReportOfModelRuns, MoeFiguresAgreeWithTheFile) {
  test::H5Reader h(*moe_);
  ASSERT_TRUE(h.ok());
  const auto experts = h.lists<int32_t>("/steps/expert_tokens", H5T_NATIVE_INT32);
  const auto wall = h.scalars<double>("/steps/wall_s", H5T_NATIVE_DOUBLE);
  const auto dispatch_s = h.scalars<double>("/steps/moe_dispatch_s", H5T_NATIVE_DOUBLE);
  const auto combine_s = h.scalars<double>("/steps/moe_combine_s", H5T_NATIVE_DOUBLE);
  const auto dispatch_b = h.scalars<int64_t>("/steps/moe_dispatch_bytes", H5T_NATIVE_INT64);
  const auto combine_b = h.scalars<int64_t>("/steps/moe_combine_bytes", H5T_NATIVE_INT64);
  const auto outputs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
  const auto rank_ids = h.scalars<int32_t>("/ranks/rank", H5T_NATIVE_INT32);
  const auto dp = h.scalars<int32_t>("/ranks/dp", H5T_NATIVE_INT32);
  const auto ep_sent = h.scalars<int64_t>("/ranks/ep_bytes_sent", H5T_NATIVE_INT64);
  // CPU ranks ran on no GPU.
  EXPECT_EQ(h.scalars<int32_t>("/ranks/device", H5T_NATIVE_INT32), std::vector<int32_t>(rank_ids.size(), -1));
  ASSERT_FALSE(experts.empty());
  ASSERT_EQ(wall.size(), experts.size());

  std::vector<int64_t> per_expert(8, 0);
  int64_t steps_with_counts = 0, dispatch_bytes = 0, combine_bytes = 0, out_tokens = 0, ep_bytes = 0;
  double wall_sum = 0, dispatch_sum = 0, combine_sum = 0;
  for (size_t i = 0; i < experts.size(); ++i) {
    ASSERT_EQ(experts[i].size(), 8u) << "step row " << i;  // every step of an MoE run has counts
    ++steps_with_counts;
    for (size_t e = 0; e < 8; ++e) per_expert[e] += experts[i][e];
    wall_sum += wall[i];
    dispatch_sum += dispatch_s[i];
    combine_sum += combine_s[i];
    dispatch_bytes += dispatch_b[i];
    combine_bytes += combine_b[i];
  }
  for (const auto& o : outputs) out_tokens += static_cast<int64_t>(o.size());
  for (int64_t b : ep_sent) ep_bytes += b;
  const int64_t routed = std::accumulate(per_expert.begin(), per_expert.end(), int64_t{0});
  const int64_t max_load = *std::max_element(per_expert.begin(), per_expert.end());

  const ReportSummary s = summarize(load_run(*moe_));
  const MoeSummary& m = s.moe;
  ASSERT_TRUE(m.present);
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.steps, steps_with_counts);
  EXPECT_EQ(m.expert_tokens, per_expert);
  EXPECT_EQ(m.routed_tokens, routed);
  EXPECT_GT(routed, 0);
  // Each token goes to 2 experts in each of the 3 MoE layers, and a row counts at least its own
  // group's tokens (all of its expert-parallel group's: with both dp groups busy, more).
  EXPECT_EQ(routed % (2 * 3), 0);
  const auto prefill = h.scalars<int32_t>("/steps/prefill_tokens", H5T_NATIVE_INT32);
  const auto decode = h.scalars<int32_t>("/steps/decode_tokens", H5T_NATIVE_INT32);
  EXPECT_GE(routed, 2 * 3 * (std::accumulate(prefill.begin(), prefill.end(), int64_t{0}) +
                             std::accumulate(decode.begin(), decode.end(), int64_t{0})));
  EXPECT_EQ(m.load_min, *std::min_element(per_expert.begin(), per_expert.end()));
  EXPECT_EQ(m.load_max, max_load);
  EXPECT_NEAR(m.load_mean, static_cast<double>(routed) / 8, 1e-9);
  EXPECT_NEAR(m.imbalance, static_cast<double>(max_load) / (static_cast<double>(routed) / 8), 1e-9);
  EXPECT_EQ(m.idle_experts, std::count(per_expert.begin(), per_expert.end(), int64_t{0}));
  ASSERT_FALSE(m.busiest.empty());
  EXPECT_EQ(per_expert[static_cast<size_t>(m.busiest[0])], max_load);
  for (size_t i = 1; i < m.busiest.size(); ++i) {
    EXPECT_GE(per_expert[static_cast<size_t>(m.busiest[i - 1])], per_expert[static_cast<size_t>(m.busiest[i])]);
  }
  EXPECT_NEAR(m.dispatch_s, dispatch_sum, 1e-12);
  EXPECT_NEAR(m.combine_s, combine_sum, 1e-12);
  EXPECT_GT(m.dispatch_s + m.combine_s, 0);
  EXPECT_NEAR(m.all_to_all_share, (dispatch_sum + combine_sum) / wall_sum, 1e-9);
  EXPECT_LT(m.all_to_all_share, 1.0);  // part of the steps' time
  EXPECT_EQ(m.dispatch_bytes, dispatch_bytes);
  EXPECT_EQ(m.combine_bytes, combine_bytes);
  // Requests go to whichever dp group asks first: when one group gets them all, its leader sends
  // tokens out (dispatch) but receives none to send back (combine), so only the sum is sure.
  EXPECT_GT(dispatch_bytes + combine_bytes, 0);
  ASSERT_EQ(s.output_tokens, out_tokens);
  EXPECT_NEAR(m.dispatch_bytes_per_token, static_cast<double>(dispatch_bytes) / static_cast<double>(out_tokens), 1e-9);
  EXPECT_NEAR(m.combine_bytes_per_token, static_cast<double>(combine_bytes) / static_cast<double>(out_tokens), 1e-9);
  EXPECT_EQ(m.ep_bytes_sent, ep_bytes);

  // Two ranks, one per dp group, both sending over the expert-parallel group.
  ASSERT_EQ(s.ranks.size(), 2u);
  ASSERT_EQ(rank_ids.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& r = *std::find_if(s.ranks.begin(), s.ranks.end(), [&](const RankSummary& x) { return x.rank == rank_ids[i]; });
    EXPECT_EQ(r.dp, dp[i]);
    EXPECT_EQ(r.ep_bytes_sent, ep_sent[i]);
    EXPECT_GT(r.ep_bytes_sent, 0);
  }
  EXPECT_EQ(s.ranks[0].dp, 0);
  EXPECT_EQ(s.ranks[1].dp, 1);
}

// The command's text and --json carry the same MoE figures.
TEST_F(ReportOfModelRuns, MoeSectionInTextAndJson) {
  const ReportSummary s = summarize(load_run(*moe_));
  const auto p = sh(report(*moe_));
  ASSERT_EQ(p.code, 0) << p.out;
  for (const std::string& want :
       {std::string("mixture of experts (8 experts, ") + std::to_string(s.moe.steps) + " steps with expert counts)",
        std::string("of the steps' wall time"), std::string(" / max ") + std::to_string(s.moe.load_max) + ", imbalance",
        std::string("(") + std::to_string(s.moe.routed_tokens) + " summed over the step rows)",
        std::to_string(s.moe.idle_experts) + " of 8 never received a token",
        std::string("e") + std::to_string(s.moe.busiest[0]) + ": " + std::to_string(s.moe.load_max) + " (", std::string("ep sent")}) {
    EXPECT_NE(p.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << p.out;
  }
  std::printf("%s", p.out.c_str());  // the report of the real run, for the log

  const auto js = sh(std::string("(") + report(*moe_ + " --json") + " 2>/dev/null)");
  ASSERT_EQ(js.code, 0) << js.out;
  const nlohmann::json j = nlohmann::json::parse(js.out);
  ASSERT_TRUE(j.contains("moe")) << js.out;
  const nlohmann::json& m = j["moe"];
  EXPECT_EQ(m["experts"], 8);
  EXPECT_EQ(m["steps"], s.moe.steps);
  EXPECT_EQ(m["expert_tokens"], s.moe.expert_tokens);
  EXPECT_EQ(m["routed_tokens"], s.moe.routed_tokens);
  EXPECT_NEAR(m["dispatch_s"].get<double>(), s.moe.dispatch_s, 1e-12);
  EXPECT_NEAR(m["all_to_all_wall_share"].get<double>(), s.moe.all_to_all_share, 1e-12);
  EXPECT_EQ(m["dispatch_bytes"], s.moe.dispatch_bytes);
  EXPECT_NEAR(m["combine_bytes_per_output_token"].get<double>(), s.moe.combine_bytes_per_token, 1e-9);
  EXPECT_EQ(m["expert_load"]["max"], s.moe.load_max);
  EXPECT_NEAR(m["expert_load"]["imbalance"].get<double>(), s.moe.imbalance, 1e-12);
  EXPECT_EQ(m["expert_load"]["idle_experts"], s.moe.idle_experts);
  EXPECT_EQ(m["expert_load"]["busiest"].size(), s.moe.busiest.size());
  EXPECT_EQ(m["ep_bytes_sent"], s.moe.ep_bytes_sent);
  ASSERT_EQ(m["ranks"].size(), 2u);
  EXPECT_EQ(m["ranks"][1]["dp"], 1);
  EXPECT_EQ(j["ranks"][1]["ep_bytes_sent"], s.ranks[1].ep_bytes_sent);
}

// A dense model's report has no MoE section, no dp / ep columns and no "moe" key.
TEST_F(ReportOfModelRuns, DenseRunHasNoMoeSection) {
  const RunData d = load_run(*dense_);
  ASSERT_GT(d.steps.size(), 0u);
  for (const auto& row : d.steps.expert_tokens) EXPECT_TRUE(row.empty());
  EXPECT_FALSE(summarize(d).moe.present);
  const auto p = sh(report(*dense_));
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("steps\n"), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find("mixture of experts"), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find("ep sent"), std::string::npos) << p.out;
  const auto js = sh(std::string("(") + report(*dense_ + " --json") + " 2>/dev/null)");
  ASSERT_EQ(js.code, 0) << js.out;
  EXPECT_FALSE(nlohmann::json::parse(js.out).contains("moe")) << js.out;
}

// jobs/plot_report.py draws experts.png for the MoE run and not for the dense one; both have stage
// figures (stages.png).
TEST_F(ReportOfModelRuns, PlotsExpertsForMoeOnly) {
  if (sh("python3 -c 'import h5py, matplotlib'").code != 0) {
    GTEST_SKIP() << "python3 with h5py and matplotlib is not importable: --plots not checked";
  }
  const fs::path moe_plots = *dir_ / "moe-plots", dense_plots = *dir_ / "dense-plots";
  const auto p = sh(report(*moe_ + " --plots " + moe_plots.string()));
  ASSERT_EQ(p.code, 0) << p.out;
  expect_pngs(moe_plots,
              {"throughput.png", "latency_hist.png", "steps.png", "replicas.png", "stages.png", "experts.png"}, p.out);
  const auto q = sh(report(*dense_ + " --plots " + dense_plots.string()));
  ASSERT_EQ(q.code, 0) << q.out;
  EXPECT_TRUE(fs::exists(dense_plots / "steps.png")) << q.out;
  EXPECT_TRUE(fs::exists(dense_plots / "stages.png")) << q.out;
  EXPECT_FALSE(fs::exists(dense_plots / "experts.png")) << q.out;
}

}  // namespace
}  // namespace shardlm::report
