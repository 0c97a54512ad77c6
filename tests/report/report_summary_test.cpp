// shardlm report's summary of a result file written from known rows (report_sample.h): the columns
// read back, counts, percentiles, throughput and the mixture-of-experts figures against values
// computed by hand, a file without the MoE columns, and a run that never finished.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "compute/op_profile.h"
#include "io/h5_group_copy.h"
#include "io/duplicate_id.h"
#include "io/h5_util.h"
#include "report/report_summary.h"
#include "report/result_file.h"
#include "report_sample.h"

namespace shardlm::report {
namespace {

// A seed is any 64-bit unsigned value: its attribute reads back as itself (it read negative past
// 2^63 when stored signed), and a signed one as before.
TEST_F(ReportTest, UnsignedAttributesReadBackWhole) {
  const std::string f = (dir_ / "seed.h5").string();
  {
    ResultWriter w(f);
    w.set_attr("seed", UINT64_MAX);
    w.set_attr("signed", int64_t{-3});
  }
  const RunData d = load_run(f);
  ASSERT_TRUE(d.attrs.at("seed").is_number_unsigned());
  EXPECT_EQ(d.attrs.at("seed").get<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(d.attrs.at("signed").get<int64_t>(), -3);
}

TEST(ErrorKind, FirstWordsWithoutLinePrefix) {
  EXPECT_EQ(error_kind("line 4: empty prompt"), "empty prompt");
  EXPECT_EQ(error_kind("line 12: prompt of 300 tokens leaves no room"), "prompt of");
  EXPECT_EQ(error_kind("line 3: not valid JSON (syntax error)"), "not valid JSON");
  EXPECT_EQ(error_kind("line 9: token id 70000 is outside the vocabulary"), "token id");
  EXPECT_EQ(error_kind("line 2: \"max_tokens\" must be >= 0 (got -1)"), "\"max_tokens\" must be");
  EXPECT_EQ(error_kind("empty prompt: \"prompt_token_ids\" is an empty list"), "empty prompt");
  EXPECT_EQ(error_kind(""), "other");
  // One kind for every duplicate id, not one per id.
  EXPECT_EQ(error_kind(duplicate_id_error(7, "alpha")), "duplicate id");
  EXPECT_EQ(error_kind(duplicate_id_error(9, "beta gamma")), "duplicate id");
  EXPECT_EQ(error_kind("line 4: duplicate id 'x' (an earlier request has it)"), "duplicate id");  // older files
}

// A run killed mid-flush can leave every column longer than its last commit, the rows past it
// holding anything: the report and merge read up to rows_committed / steps_committed, as a
// resumed writer keeps.
TEST_F(ReportTest, ReadsOnlyTheCommittedRows) {
  {
    hid_t f = H5Fopen(file_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    h5::write_attr(f, "rows_committed", int64_t{4}, "test");
    h5::write_attr(f, "steps_committed", int64_t{2}, "test");
    H5Fclose(f);
  }
  const RunData d = load_run(file_);
  ASSERT_EQ(d.requests.size(), 4u);
  EXPECT_EQ(d.requests.id[3], "r4");
  EXPECT_EQ(d.requests.t_finished.size(), 4u);
  EXPECT_EQ(d.steps.size(), 2u);
  EXPECT_EQ(d.steps.expert_tokens.size(), 2u);
  hid_t f = H5Fopen(file_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(h5::GroupAppender::rows_in(f, "requests", "test"), 4u);  // what merge copies
  EXPECT_EQ(h5::GroupAppender::rows_in(f, "steps", "test"), 2u);
  EXPECT_EQ(h5::GroupAppender::rows_in(f, "ranks", "test"), 2u);  // no commit attribute: every row
  H5Fclose(f);
}

TEST_F(ReportTest, ReadsTheColumnsBack) {
  const RunData d = load_run(file_);
  ASSERT_EQ(d.requests.size(), 6u);
  EXPECT_EQ(d.requests.id[5], "r6");
  EXPECT_EQ(d.requests.prompt_len[4], 10);
  EXPECT_EQ(d.requests.output_len[0], 5);
  EXPECT_EQ(d.requests.finish_reason[1], "length");
  EXPECT_EQ(d.requests.error[3], "line 4: empty prompt");
  EXPECT_EQ(d.requests.replica[5], 1);
  EXPECT_DOUBLE_EQ(d.requests.t_first_token[5], 1.5);
  ASSERT_EQ(d.steps.size(), 4u);
  EXPECT_EQ(d.steps.kv_blocks_used[3], 5);
  ASSERT_EQ(d.ranks.size(), 2u);
  EXPECT_EQ(d.ranks.host[1], "node-b");
  EXPECT_EQ(d.ranks.pp_bytes_sent[1], 440);
  EXPECT_EQ(d.attrs.at("git_commit"), "abc123def456");
  EXPECT_EQ(d.attrs.at("requests"), 6);
  EXPECT_DOUBLE_EQ(d.attrs.at("wall_seconds").get<double>(), 2.5);
}

TEST_F(ReportTest, SummaryNumbers) {
  const ReportSummary s = summarize(load_run(file_));
  EXPECT_EQ(s.version, "0.1.0");
  EXPECT_EQ(s.git_commit, "abc123def456");
  EXPECT_TRUE(s.finished);
  EXPECT_EQ(s.interrupted_by_signal, 0);

  EXPECT_EQ(s.requests, 6);
  EXPECT_EQ(s.ok, 4);
  EXPECT_EQ(s.errors, 2);
  EXPECT_EQ(s.error_kinds, (std::map<std::string, int64_t>{{"empty prompt", 1}, {"prompt of", 1}}));
  EXPECT_EQ(s.finish_reasons, (std::map<std::string, int64_t>{{"error", 2}, {"length", 1}, {"stop", 3}}));
  EXPECT_EQ(s.max_model_len, 5);
  EXPECT_EQ(s.stopped_at_context_limit, 1);  // r2: 2 + 3 tokens
  // The prompts the model ran: not r5's 10 tokens, rejected as too long.
  EXPECT_EQ(s.prompt_tokens, 10);
  EXPECT_EQ(s.output_tokens, 11);
  ASSERT_EQ(s.replicas.size(), 2u);
  EXPECT_EQ(s.replicas.at(0).requests, 3);
  EXPECT_EQ(s.replicas.at(0).output_tokens, 6);
  EXPECT_EQ(s.replicas.at(1).output_tokens, 5);
  EXPECT_EQ(s.replicas.at(1).steps, 2);

  // Over wall_seconds = 2.5: 11 output tokens, 21 tokens, 6 requests.
  EXPECT_DOUBLE_EQ(s.wall_s, 2.5);
  EXPECT_EQ(s.wall_source, "wall_seconds");
  EXPECT_NEAR(s.output_tokens_per_s, 4.4, kTol);
  EXPECT_NEAR(s.total_tokens_per_s, 8.4, kTol);
  EXPECT_NEAR(s.requests_per_s, 2.4, kTol);

  // TTFT {0.1, 0.2, 0.3, 0.5}: p50 at 1.5 -> 0.25, p90 at 2.7 -> 0.44, p99 at 2.97 -> 0.494.
  EXPECT_EQ(s.ttft.n, 4);
  EXPECT_NEAR(s.ttft.mean, 0.275, kTol);
  EXPECT_NEAR(s.ttft.p50, 0.25, kTol);
  EXPECT_NEAR(s.ttft.p90, 0.44, kTol);
  EXPECT_NEAR(s.ttft.p99, 0.494, kTol);
  EXPECT_NEAR(s.ttft.max, 0.5, kTol);
  // TPOT {0.1, 0.2, 0.5} (r3 has one token): p50 0.2, p90 at 1.8 -> 0.44, p99 at 1.98 -> 0.494.
  EXPECT_EQ(s.tpot.n, 3);
  EXPECT_NEAR(s.tpot.mean, 0.8 / 3, kTol);
  EXPECT_NEAR(s.tpot.p50, 0.2, kTol);
  EXPECT_NEAR(s.tpot.p90, 0.44, kTol);
  EXPECT_NEAR(s.tpot.p99, 0.494, kTol);
  EXPECT_NEAR(s.tpot.max, 0.5, kTol);
  // End-to-end {0.2, 0.5, 0.7, 1.0}: p50 0.6, p90 0.91, p99 0.991.
  EXPECT_EQ(s.e2e.n, 4);
  EXPECT_NEAR(s.e2e.mean, 0.6, kTol);
  EXPECT_NEAR(s.e2e.p50, 0.6, kTol);
  EXPECT_NEAR(s.e2e.p90, 0.91, kTol);
  EXPECT_NEAR(s.e2e.p99, 0.991, kTol);
  EXPECT_NEAR(s.e2e.max, 1.0, kTol);

  // Steps: batch 2,2,1,3; prefill 7+0+2+1 = 10; decode 0+2+0+2 = 4; wall 0.1+0.05+0.2+0.05.
  EXPECT_EQ(s.steps, 4);
  EXPECT_NEAR(s.mean_batch_size, 2.0, kTol);
  EXPECT_EQ(s.step_prefill_tokens, 10);
  EXPECT_EQ(s.step_decode_tokens, 4);
  EXPECT_NEAR(s.prefill_share, 10.0 / 14, kTol);
  EXPECT_NEAR(s.decode_share, 4.0 / 14, kTol);
  EXPECT_NEAR(s.mean_step_wall_s, 0.1, kTol);
  EXPECT_EQ(s.kv_blocks_used_max, 5);

  // Ranks: 2 GB in 0.5 s = 4 GB/s; 1 GB in 2 s = 0.5 GB/s. Bytes per output token: 1100/11,
  // 440/11, 220/11.
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_NEAR(s.ranks[0].load_gb_per_s, 4.0, kTol);
  EXPECT_NEAR(s.ranks[1].load_gb_per_s, 0.5, kTol);
  EXPECT_EQ(s.ranks[1].host, "node-b");
  EXPECT_EQ(s.peak_rss_max, int64_t{3} << 29);
  EXPECT_EQ(s.tp_bytes_sent, 1100);
  EXPECT_NEAR(s.tp_bytes_per_token, 100.0, kTol);
  EXPECT_NEAR(s.pp_bytes_per_token, 40.0, kTol);
  EXPECT_NEAR(s.replica_bytes_per_token, 20.0, kTol);
}

// The sample is a dense run (empty expert_tokens rows): no MoE section, no dp / ep columns.
TEST_F(ReportTest, DenseRunHasNoMoeSection) {
  const RunData d = load_run(file_);
  ASSERT_EQ(d.steps.expert_tokens.size(), 4u);
  for (const auto& row : d.steps.expert_tokens) EXPECT_TRUE(row.empty());
  EXPECT_TRUE(d.ranks.has_dp);
  const ReportSummary s = summarize(d);
  EXPECT_FALSE(s.moe.present);
  EXPECT_FALSE(s.ranks_show_dp_ep);
  const std::string text = format_report(s);
  EXPECT_EQ(text.find("mixture of experts"), std::string::npos) << text;
  EXPECT_EQ(text.find("ep sent"), std::string::npos) << text;
  EXPECT_FALSE(report_json(s).contains("moe"));
  EXPECT_FALSE(report_json(s)["ranks"][0].contains("dp"));
}

// A file written before the MoE columns existed (they are deleted here) reads as a dense run.
TEST_F(ReportTest, FileWithoutMoeColumnsReads) {
  const std::string old = (dir_ / "old.h5").string();
  fs::copy_file(file_, old);
  {
    const hid_t f = H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (const char* col : {"/steps/moe_dispatch_s", "/steps/moe_combine_s", "/steps/moe_dispatch_bytes",
                            "/steps/moe_combine_bytes", "/steps/expert_tokens", "/ranks/dp", "/ranks/ep_bytes_sent"}) {
      EXPECT_GE(H5Ldelete(f, col, H5P_DEFAULT), 0) << col;
    }
    H5Fclose(f);
  }
  const RunData d = load_run(old);
  ASSERT_EQ(d.steps.size(), 4u);
  EXPECT_EQ(d.steps.expert_tokens.size(), 4u);
  EXPECT_EQ(d.steps.moe_dispatch_s, std::vector<double>(4, 0.0));
  EXPECT_FALSE(d.ranks.has_dp);
  EXPECT_FALSE(d.ranks.has_ep_bytes_sent);
  ASSERT_EQ(d.ranks.size(), 2u);
  EXPECT_EQ(d.ranks.dp, std::vector<int64_t>(2, 0));
  const ReportSummary s = summarize(d);
  EXPECT_FALSE(s.moe.present);
  ReportSummary now = summarize(load_run(file_));
  now.path = old;
  EXPECT_EQ(format_report(s), format_report(now));
}

// Known /op_profile rows (as shardlm run --op-profile writes them), the figures by hand:
//   rank 0, decode: 4 steps of 1.0 s in all; "attn" 4 calls 0.4 s (4 GB of weights), "mlp" 8 calls
//   0.2 s (bytes not counted)
//   rank 1, decode: 2 steps of 1.0 s in all; "attn" 2 calls 0.6 s (3 GB)
//   rank 1, prefill: 1 step of 2.0 s; "attn" 1 call 1.5 s
// decode: attn on 2 ranks, per step 100 000 us (rank 0) and 300 000 us (rank 1): mean 200 000,
// max 300 000 at rank 1, share (0.4 + 0.6) / 2 = 0.5; mlp on rank 0 alone, 50 000 us, 2 calls a
// step, share 0.2; outside: rank 0 (1.0 - 0.6) / 4 = 100 000 us, rank 1 (1.0 - 0.6) / 2 = 200 000,
// mean 150 000, share 0.4; a step: mean of 250 000 and 500 000 us. attn's weights: 10 and 5 GB/s,
// 7.5 on average.
TEST_F(ReportTest, OpProfileByHand) {
  const std::string f = (dir_ / "op.h5").string();
  {
    ResultWriter w(f);
    w.append(request("r1", 3, 10, FinishReason::kLength, 0.0, 0.1, 1.0, 0));
    w.write_op_profile({{0, "decode", "attn", 4, 4, 0.4, 1.0, 4000000000},
                        {0, "decode", "mlp", 4, 8, 0.2, 1.0, 0},
                        {1, "decode", "attn", 2, 2, 0.6, 1.0, 3000000000},
                        {1, "prefill", "attn", 1, 1, 1.5, 2.0, 0}});
    w.close();
  }
  const ReportSummary s = summarize(load_run(f));
  ASSERT_EQ(s.op_profile.size(), 2u);
  const OpKindSummary& d = s.op_profile[0];
  EXPECT_EQ(d.kind, "decode");
  EXPECT_EQ(d.ranks, 2);
  EXPECT_EQ(d.steps, 4);
  EXPECT_NEAR(d.step_us, 375000, 1e-6);
  ASSERT_EQ(d.sections.size(), 3u);
  EXPECT_EQ(d.sections[0].section, "attn");
  EXPECT_EQ(d.sections[0].ranks, 2);
  EXPECT_NEAR(d.sections[0].calls_per_step, 1, kTol);
  EXPECT_NEAR(d.sections[0].mean_us, 200000, 1e-6);
  EXPECT_NEAR(d.sections[0].max_us, 300000, 1e-6);
  EXPECT_EQ(d.sections[0].max_rank, 1);
  EXPECT_NEAR(d.sections[0].share, 0.5, kTol);
  EXPECT_NEAR(d.sections[0].gb_per_s, (10 + 5) / 2.0, kTol);  // 4 GB in 0.4 s, 3 GB in 0.6 s
  EXPECT_EQ(d.sections[1].gb_per_s, 0);                       // not counted
  EXPECT_EQ(d.sections[1].section, "mlp");
  EXPECT_EQ(d.sections[1].ranks, 1);
  EXPECT_NEAR(d.sections[1].calls_per_step, 2, kTol);
  EXPECT_NEAR(d.sections[1].mean_us, 50000, 1e-6);
  EXPECT_NEAR(d.sections[1].share, 0.2, kTol);
  EXPECT_EQ(d.sections[2].section, "(outside sections)");
  EXPECT_NEAR(d.sections[2].mean_us, 150000, 1e-6);
  EXPECT_NEAR(d.sections[2].max_us, 200000, 1e-6);
  EXPECT_EQ(d.sections[2].max_rank, 1);
  EXPECT_NEAR(d.sections[2].share, 0.4, kTol);
  EXPECT_EQ(s.op_profile[1].kind, "prefill");
  EXPECT_EQ(s.op_profile[1].ranks, 1);
  EXPECT_NEAR(s.op_profile[1].sections[0].share, 0.75, kTol);
  const std::string text = format_report(s);
  for (const char* want :
       {"op profile, decode steps (2 ranks, up to 4 steps, 375000.0 us a step)",
        "  attn                          2          1     200000.0     300000.0    (1)          7.5   50.0%",
        "  mlp                           1          2      50000.0      50000.0    (0)                20.0%",
        "  (outside sections)            2                150000.0     200000.0    (1)                40.0%",
        "op profile, prefill steps (1 ranks, up to 1 steps"})
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in:\n" << text;
  const nlohmann::json j = report_json(s);
  ASSERT_EQ(j["op_profile"].size(), 2u);
  EXPECT_EQ(j["op_profile"][0]["sections"][0]["max_rank"], 1);
  EXPECT_NEAR(j["op_profile"][0]["sections"][1]["mean_us_per_step"].get<double>(), 50000, 1e-6);
  EXPECT_NEAR(j["op_profile"][0]["sections"][0]["weights_gb_per_s"].get<double>(), 7.5, kTol);
  // A file without /op_profile has none.
  EXPECT_TRUE(summarize(load_run(file_)).op_profile.empty());
  EXPECT_FALSE(report_json(summarize(load_run(file_))).contains("op_profile"));
}

// A step replayed from a CUDA graph sends its rows without timing the all-to-all apart: the share
// is over the steps that timed it (0.04 s of step 0's 0.2 s), not diluted by the replayed one.
TEST_F(ReportTest, MoeShareLeavesOutReplayedSteps) {
  const std::string f = (dir_ / "moe-graphs.h5").string();
  {
    ResultWriter w(f);
    w.append(request("r1", 3, 10, FinishReason::kLength, 0.0, 0.1, 1.0, 0));
    auto moe_step = [](int64_t n, double wall, double seconds, int64_t bytes) {
      StepRecord st = step(n, 0, 1, 1, 0, 1, 0.1 * static_cast<double>(n), wall);
      st.moe_dispatch_s = st.moe_combine_s = seconds;
      st.moe_dispatch_bytes = st.moe_combine_bytes = bytes;
      st.expert_tokens = {1, 1};
      return st;
    };
    w.append_step(moe_step(0, 0.2, 0.02, 100));
    w.append_step(moe_step(1, 0.8, 0.0, 100));  // replayed
    w.set_attr("wall_seconds", 1.0);
    w.close();
  }
  const ReportSummary s = summarize(load_run(f));
  EXPECT_EQ(s.moe.unmeasured_steps, 1);
  EXPECT_NEAR(s.moe.all_to_all_share, 0.2, kTol);
  EXPECT_EQ(s.moe.dispatch_bytes, 200);
  const std::string text = format_report(s);
  EXPECT_NE(text.find("= 20.0% of the steps' wall time (dispatch 10.0%, combine 10.0%); left out: 1 step(s) "
                      "replayed from graphs, not timed apart"),
            std::string::npos)
      << text;
}

// Known stage times: the figures by hand.
//   step 0: wall 0.2, compute [0.1, 0.05], comm [0.02, 0.1]
//   step 1: wall 0.3, compute [0.2, 0.1], comm [0.04, 0.15]
//   step 2: wall 0.5, no stage figures (a row from before the columns): left out
// 2 steps of 0.5 s: stage 0 computes 0.3 s (150 ms a step, 60%) and communicates 0.06 s (30 ms,
// 12%); stage 1 0.15 s (75 ms, 30%) and 0.25 s (125 ms, 50%).
TEST_F(ReportTest, StageTimesByHand) {
  const std::string f = (dir_ / "stages.h5").string();
  {
    ResultWriter w(f);
    w.append(request("r1", 3, 10, FinishReason::kLength, 0.0, 0.1, 1.0, 0));
    StepRecord a = step(0, 0, 1, 3, 0, 1, 0.0, 0.2), b = step(1, 0, 1, 0, 1, 1, 0.2, 0.3),
               c = step(2, 0, 1, 0, 1, 1, 0.5, 0.5);
    a.stage_compute_s = {0.1, 0.05};
    a.stage_comm_s = {0.02, 0.1};
    b.stage_compute_s = {0.2, 0.1};
    b.stage_comm_s = {0.04, 0.15};
    for (const StepRecord& st : {a, b, c}) w.append_step(st);
    w.close();
  }
  const ReportSummary s = summarize(load_run(f));
  ASSERT_EQ(s.stages.steps, 2);
  EXPECT_NEAR(s.stages.wall_s, 0.5, kTol);
  ASSERT_EQ(s.stages.stages.size(), 2u);
  const StageTimeSummary& s0 = s.stages.stages[0];
  const StageTimeSummary& s1 = s.stages.stages[1];
  EXPECT_NEAR(s0.compute_ms, 150.0, 1e-9);
  EXPECT_NEAR(s0.comm_ms, 30.0, 1e-9);
  EXPECT_NEAR(s0.compute_share, 0.6, 1e-12);
  EXPECT_NEAR(s0.comm_share, 0.12, 1e-12);
  EXPECT_NEAR(s1.compute_ms, 75.0, 1e-9);
  EXPECT_NEAR(s1.comm_ms, 125.0, 1e-9);
  EXPECT_NEAR(s1.compute_share, 0.3, 1e-12);
  EXPECT_NEAR(s1.comm_share, 0.5, 1e-12);
  const std::string text = format_report(s);
  EXPECT_NE(text.find("step time by pipeline stage (its tp rank 0, 2 steps, 250.000 ms of step wall each)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("      0          150.000         30.000          60.0%          12.0%"), std::string::npos)
      << text;
  EXPECT_NE(text.find("      1           75.000        125.000          30.0%          50.0%"), std::string::npos)
      << text;
  const nlohmann::json j = report_json(s)["steps"]["stages"];
  EXPECT_EQ(j["steps"], 2);
  EXPECT_NEAR(j["stages"][1]["comm_share"].get<double>(), 0.5, 1e-12);
}

// Known MoE rows: the figures by hand.
//   step 0: wall 0.2, dispatch 0.01 s / 100 B, combine 0.03 s / 300 B, experts [4, 0, 2, 6]
//   step 1: wall 0.3, dispatch 0.02 s / 200 B, combine 0.04 s / 400 B, experts [2, 0, 0, 6, 4]
//   step 2: wall 0.5, no expert counts (an older stage's row): times still count
// Totals: experts [6, 0, 2, 12, 4] (24 routed, mean 4.8, max/mean 2.5), 1 idle; all-to-all
// 0.03 + 0.07 = 0.1 s of 1.0 s; 10 output tokens: 30 B and 70 B per token.
TEST_F(ReportTest, MoeFiguresByHand) {
  const std::string f = (dir_ / "moe.h5").string();
  {
    ResultWriter w(f);
    w.append(request("r1", 3, 10, FinishReason::kLength, 0.0, 0.1, 1.0, 0));
    auto moe_step = [](int64_t n, double wall, double ds, int64_t db, double cs, int64_t cb, std::vector<int32_t> e) {
      StepRecord st = step(n, static_cast<int>(n % 2), 1, 1, 0, 1, 0.1 * static_cast<double>(n), wall);
      st.moe_dispatch_s = ds;
      st.moe_dispatch_bytes = db;
      st.moe_combine_s = cs;
      st.moe_combine_bytes = cb;
      st.expert_tokens = std::move(e);
      return st;
    };
    w.append_step(moe_step(0, 0.2, 0.01, 100, 0.03, 300, {4, 0, 2, 6}));
    w.append_step(moe_step(1, 0.3, 0.02, 200, 0.04, 400, {2, 0, 0, 6, 4}));
    w.append_step(moe_step(2, 0.5, 0.0, 0, 0.0, 0, {}));
    RankRecord r0 = rank(0, 0, "node-a", 1000, 1.0, 1 << 20, 0, 0, 0), r1 = r0;
    r1.rank = 1;
    r1.dp = 1;
    r0.ep_bytes_sent = 1500;
    r1.ep_bytes_sent = 500;
    w.write_ranks({r0, r1});
    w.set_attr("wall_seconds", 2.0);
    w.set_attr("config", std::string("model = m\nep-graph-capacity = 2\nep-wire = bf16\nmax-new-tokens = 8"));
    w.close();
  }
  const ReportSummary s = summarize(load_run(f));
  const MoeSummary& m = s.moe;
  EXPECT_EQ(m.ep_wire, "bf16");
  ASSERT_TRUE(m.present);
  EXPECT_EQ(m.experts, 5);
  EXPECT_EQ(m.steps, 2);
  EXPECT_EQ(m.expert_tokens, (std::vector<int64_t>{6, 0, 2, 12, 4}));
  EXPECT_EQ(m.routed_tokens, 24);
  EXPECT_EQ(m.load_min, 0);
  EXPECT_EQ(m.load_max, 12);
  EXPECT_NEAR(m.load_mean, 4.8, kTol);
  EXPECT_NEAR(m.imbalance, 2.5, kTol);
  EXPECT_EQ(m.idle_experts, 1);
  EXPECT_EQ(m.busiest, (std::vector<int64_t>{3, 0, 4, 2}));  // the idle expert is not listed
  EXPECT_NEAR(m.dispatch_s, 0.03, kTol);
  EXPECT_NEAR(m.combine_s, 0.07, kTol);
  EXPECT_NEAR(m.all_to_all_share, 0.1, kTol);
  EXPECT_NEAR(m.dispatch_share, 0.03, kTol);
  EXPECT_EQ(m.dispatch_bytes, 300);
  EXPECT_EQ(m.combine_bytes, 700);
  EXPECT_NEAR(m.dispatch_bytes_per_token, 30.0, kTol);
  EXPECT_NEAR(m.combine_bytes_per_token, 70.0, kTol);
  EXPECT_EQ(m.ep_bytes_sent, 2000);
  EXPECT_NEAR(m.ep_bytes_per_token, 200.0, kTol);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[1].dp, 1);
  EXPECT_TRUE(s.ranks_show_dp_ep);
  const std::string text = format_report(s);
  for (const char* want :
       {"mixture of experts (5 experts, 2 steps with expert counts)",
        "dispatch 30.000 ms + combine 70.000 ms = 10.0% of the steps' wall time (dispatch 3.0%, combine 7.0%)",
        "30 B per output token (300 B in all, sent by the step leaders; rows in bf16)",
        "70 B per output token (700 B in all",
        "min 0 / mean 4.8 / max 12, imbalance (max/mean) 2.50 (24 summed over the step rows)",
        "1 of 5 never received a token", "e3: 12 (50.0%), e0: 6 (25.0%), e4: 4 (16.7%), e2: 2 (8.3%)", " dp ",
        "ep sent", "1.46 KiB", "200 B (1.95 KiB in all)"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in:\n" << text;
  }
  // An fp8 wire's combine results travel in bf16 (arch/expert_wire.h); a name this build does not
  // know is shown as written.
  ReportSummary fp8 = s;
  fp8.moe.ep_wire = "fp8";
  const std::string fp8_text = format_report(fp8);
  EXPECT_NE(fp8_text.find("(300 B in all, sent by the step leaders; rows in fp8)"), std::string::npos) << fp8_text;
  EXPECT_NE(fp8_text.find("(700 B in all, sent by the step leaders; rows in bf16)"), std::string::npos) << fp8_text;
  fp8.moe.ep_wire = "fp4";
  EXPECT_NE(format_report(fp8).find("(700 B in all, sent by the step leaders; rows in fp4)"), std::string::npos);
  const nlohmann::json j = report_json(s);
  ASSERT_TRUE(j.contains("moe"));
  EXPECT_EQ(j["moe"]["expert_tokens"], (std::vector<int64_t>{6, 0, 2, 12, 4}));
  EXPECT_EQ(j["moe"]["ep_wire"], "bf16");
  EXPECT_NEAR(j["moe"]["expert_load"]["imbalance"].get<double>(), 2.5, kTol);
  EXPECT_EQ(j["moe"]["expert_load"]["busiest"][0]["expert"], 3);
  EXPECT_EQ(j["moe"]["ranks"][1]["dp"], 1);
  EXPECT_EQ(j["ranks"][0]["ep_bytes_sent"], 1500);
}

TEST_F(ReportTest, UnfinishedRunUsesTheLastFinishTime) {
  const std::string f = (dir_ / "crashed.h5").string();
  write_sample(f, /*finished=*/false);
  const ReportSummary s = summarize(load_run(f));
  EXPECT_FALSE(s.finished);
  EXPECT_EQ(s.wall_source, "last t_finished");
  EXPECT_DOUBLE_EQ(s.wall_s, 2.0);
  EXPECT_NEAR(s.output_tokens_per_s, 5.5, kTol);
  EXPECT_TRUE(s.ranks.empty());
  EXPECT_NE(format_report(s).find("incomplete"), std::string::npos) << format_report(s);
}

// Root attributes a resumed session writes at its start (cli/run_sessions.h).
void mark_resumed(const std::string& path, int64_t rows_before, double wall_before) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  h5::write_attr(f, "sessions", int64_t{2}, "test");
  h5::write_attr(f, "session_rows_before", rows_before, "test");
  h5::write_attr(f, "wall_seconds_before", wall_before, "test");
  H5Fclose(f);
}

// A resumed run whose last session did not end: its rows' times count from that session's start,
// so the running time is the earlier sessions' (10 s) plus the last one's last finish (r6: 2.0 s),
// not the largest t_finished of the file (2.0 s).
TEST_F(ReportTest, UnfinishedResumedRunAddsTheEarlierSessions) {
  const std::string f = (dir_ / "resumed-crashed.h5").string();
  write_sample(f, /*finished=*/false);
  mark_resumed(f, 3, 10.0);
  const ReportSummary s = summarize(load_run(f));
  EXPECT_FALSE(s.finished);
  EXPECT_DOUBLE_EQ(s.wall_s, 12.0);
  EXPECT_NE(s.wall_source.find("wall_seconds_before"), std::string::npos) << s.wall_source;
  EXPECT_NEAR(s.output_tokens_per_s, 11.0 / 12.0, kTol);
  const RunningTime t = running_time(load_run(f));
  EXPECT_FALSE(t.ended);
  EXPECT_TRUE(t.earlier);
  EXPECT_DOUBLE_EQ(t.seconds, 12.0);
}

// /ranks holds the last session's bytes (each session rewrites it): per output token of that
// session's rows (r4..r6: 2 tokens), not of the whole file's 11.
TEST_F(ReportTest, CommPerTokenOfAResumedRunIsTheLastSessions) {
  const std::string f = (dir_ / "resumed.h5").string();
  write_sample(f);
  mark_resumed(f, 3, 10.0);
  const ReportSummary s = summarize(load_run(f));
  EXPECT_TRUE(s.finished);
  EXPECT_DOUBLE_EQ(s.wall_s, 2.5);  // the ended run's wall_seconds: every session's
  EXPECT_EQ(s.sessions, 2);
  EXPECT_EQ(s.session_output_tokens, 2);
  EXPECT_NEAR(s.tp_bytes_per_token, 1100.0 / 2, kTol);
  EXPECT_NEAR(s.pp_bytes_per_token, 440.0 / 2, kTol);
  EXPECT_NE(format_report(s).find("comm (bytes sent per output token, of the last session)"), std::string::npos)
      << format_report(s);
  EXPECT_EQ(report_json(s)["comm"]["session_output_tokens"], 2);
}

// A value longer than any fixed buffer (a long command line) is printed whole, on its own line.
TEST_F(ReportTest, LongValuesArePrintedWhole) {
  ReportSummary s = summarize(load_run(file_));
  s.command_line = "shardlm run" + std::string(2000, 'x') + " --end";
  const std::string text = format_report(s);
  EXPECT_NE(text.find("  command       " + s.command_line + "\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace shardlm::report
