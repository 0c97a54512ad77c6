// shardlm report: a result file written with ResultWriter from known rows, read back and summarised
// (counts, percentiles, throughput checked against hand-computed values), then the command itself:
// text, --json, errors, and --plots. Then real runs of tiny random-weight models: a Mixtral-shaped
// MoE model over 2 ranks (--dp 2 --ep 2), whose mixture-of-experts figures must agree with sums
// taken from the file here, and a dense model, whose report must have no MoE section.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/shared_data.h"
#include "core/error.h"
#include "io/result_writer.h"
#include "report/report_summary.h"
#include "report/result_file.h"

namespace fs = std::filesystem;
using shardlm::test::fresh_dir;
using shardlm::test::mpirun;
using shardlm::test::sh;
using shardlm::test::shardlm_bin;

namespace shardlm::report {
namespace {

// Each of NAMES is a PNG of some size in DIR, and the report's output lists it.
void expect_pngs(const fs::path& dir, std::initializer_list<const char*> names, const std::string& out) {
  for (const char* name : names) {
    const fs::path png = dir / name;
    ASSERT_TRUE(fs::exists(png)) << png << "\n" << out;
    EXPECT_GT(fs::file_size(png), 1000u) << png;
    std::ifstream in(png, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << png;
    EXPECT_NE(out.find(png.string()), std::string::npos) << "not listed: " << png << "\n" << out;
  }
}

constexpr double kTol = 1e-12;

RequestResult request(const std::string& id, int prompt, int output, FinishReason reason, double tq, double tf,
                      double tend, int replica, const std::string& error = "") {
  RequestResult r;
  r.id = id;
  r.line = std::stoll(id.substr(1));
  r.prompt_tokens.assign(static_cast<size_t>(prompt), 7);
  r.output_tokens.assign(static_cast<size_t>(output), 9);
  r.token_logprobs.assign(static_cast<size_t>(output), -0.5f);
  r.output_text = std::string(static_cast<size_t>(output), 'x');
  r.finish_reason = reason;
  r.error = error;
  r.replica = replica;
  r.t_queued = tq;
  r.t_first_token = tf;
  r.t_finished = tend;
  return r;
}

StepRecord step(int64_t n, int replica, int batch, int prefill, int decode, int kv, double t, double wall) {
  StepRecord s;
  s.step = n;
  s.replica = replica;
  s.batch_size = batch;
  s.prefill_tokens = prefill;
  s.decode_tokens = decode;
  s.kv_blocks_used = kv;
  s.t_start = t;
  s.wall_s = wall;
  return s;
}

RankRecord rank(int r, int replica, const std::string& host, int64_t load, double load_s, int64_t rss, int64_t tp,
                int64_t pp, int64_t rep) {
  RankRecord k;
  k.rank = r;
  k.replica = replica;
  k.host = host;
  k.load_bytes = load;
  k.load_s = load_s;
  k.peak_rss_bytes = rss;
  k.tp_bytes_sent = tp;
  k.pp_bytes_sent = pp;
  k.replica_bytes_sent = rep;
  return k;
}

// Six requests over two replicas, two of them errors:
//   r1: 3 prompt, 5 out, stop,   queued 0.0, first 0.1, done 0.5  TTFT 0.1 TPOT 0.1 e2e 0.5
//   r2: 2 prompt, 3 out, length, queued 0.0, first 0.3, done 0.7  TTFT 0.3 TPOT 0.2 e2e 0.7
//   r3: 4 prompt, 1 out, stop,   queued 0.5, first 0.7, done 0.7  TTFT 0.2 (no TPOT) e2e 0.2
//   r4: error "empty prompt"; r5: error "prompt of 10 tokens ..." (10 prompt tokens)
//   r6: 1 prompt, 2 out, stop,   queued 1.0, first 1.5, done 2.0  TTFT 0.5 TPOT 0.5 e2e 1.0
// The attributes hold a wrong ttft_p50_s on purpose: the report must compute from the rows.
void write_sample(const std::string& path, bool finished = true, int64_t signal = 0) {
  ResultWriter w(path);
  w.set_attr("version", std::string("0.1.0"));
  w.set_attr("git_commit", std::string("abc123def456"));
  w.set_attr("layout", std::string("world=2 tp=1 pp=1 replicas=2"));
  w.set_attr("command_line", std::string("shardlm run --model m --prompts p.jsonl --out r.h5"));
  w.append(request("r1", 3, 5, FinishReason::kStop, 0.0, 0.1, 0.5, 0));
  w.append(request("r2", 2, 3, FinishReason::kLength, 0.0, 0.3, 0.7, 1));
  w.append(request("r3", 4, 1, FinishReason::kStop, 0.5, 0.7, 0.7, 0));
  w.append(request("r4", 0, 0, FinishReason::kError, 0.2, 0.2, 0.2, 1, "line 4: empty prompt"));
  w.append(request("r5", 10, 0, FinishReason::kError, 0.3, 0.3, 0.3, 0,
                   "line 5: prompt of 10 tokens leaves no room to generate within the context of 8 tokens"));
  w.append(request("r6", 1, 2, FinishReason::kStop, 1.0, 1.5, 2.0, 1));
  w.append_step(step(0, 0, 2, 7, 0, 2, 0.0, 0.1));
  w.append_step(step(1, 0, 2, 0, 2, 3, 0.1, 0.05));
  w.append_step(step(0, 1, 1, 2, 0, 1, 0.0, 0.2));
  w.append_step(step(1, 1, 3, 1, 2, 5, 0.3, 0.05));
  if (finished) {
    w.write_ranks({rank(0, 0, "node-a", 2'000'000'000, 0.5, int64_t{1} << 30, 1100, 0, 220),
                   rank(1, 1, "node-b", 1'000'000'000, 2.0, int64_t{3} << 29, 0, 440, 0)});
    w.set_attr("wall_seconds", 2.5);
    w.set_attr("ttft_p50_s", 99.0);
    w.set_attr("requests", int64_t{6});
    w.set_attr("interrupted_by_signal", signal);
  }
  w.close();
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("report");
    file_ = (dir_ / "results.h5").string();
    write_sample(file_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string report(const std::string& args) {
    return std::string(SHARDLM_BINARY) + " report " + args;
  }
  fs::path dir_;
  std::string file_;
};

TEST(ErrorKind, FirstWordsWithoutLinePrefix) {
  EXPECT_EQ(error_kind("line 4: empty prompt"), "empty prompt");
  EXPECT_EQ(error_kind("line 12: prompt of 300 tokens leaves no room"), "prompt of");
  EXPECT_EQ(error_kind("line 3: not valid JSON (syntax error)"), "not valid JSON");
  EXPECT_EQ(error_kind("line 9: token id 70000 is outside the vocabulary"), "token id");
  EXPECT_EQ(error_kind("line 2: \"max_tokens\" must be >= 0 (got -1)"), "\"max_tokens\" must be");
  EXPECT_EQ(error_kind("empty prompt: \"prompt_token_ids\" is an empty list"), "empty prompt");
  EXPECT_EQ(error_kind(""), "other");
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
  EXPECT_EQ(s.prompt_tokens, 20);
  EXPECT_EQ(s.output_tokens, 11);
  ASSERT_EQ(s.replicas.size(), 2u);
  EXPECT_EQ(s.replicas.at(0).requests, 3);
  EXPECT_EQ(s.replicas.at(0).output_tokens, 6);
  EXPECT_EQ(s.replicas.at(1).output_tokens, 5);
  EXPECT_EQ(s.replicas.at(1).steps, 2);

  // Over wall_seconds = 2.5: 11 output tokens, 31 tokens, 6 requests.
  EXPECT_DOUBLE_EQ(s.wall_s, 2.5);
  EXPECT_EQ(s.wall_source, "wall_seconds");
  EXPECT_NEAR(s.output_tokens_per_s, 4.4, kTol);
  EXPECT_NEAR(s.total_tokens_per_s, 12.4, kTol);
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
    w.close();
  }
  const ReportSummary s = summarize(load_run(f));
  const MoeSummary& m = s.moe;
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
  for (const char* want : {"mixture of experts (5 experts, 2 steps with expert counts)",
                           "dispatch 30.000 ms + combine 70.000 ms = 10.0% of the steps' wall time (dispatch 3.0%, combine 7.0%)",
                           "30 B per output token (300 B in all", "70 B per output token (700 B in all",
                           "min 0 / mean 4.8 / max 12, imbalance (max/mean) 2.50 (24 summed over the step rows)",
                           "1 of 5 never received a token", "e3: 12 (50.0%), e0: 6 (25.0%), e4: 4 (16.7%), e2: 2 (8.3%)",
                           " dp ", "ep sent", "1.46 KiB", "200 B (1.95 KiB in all)"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in:\n" << text;
  }
  const nlohmann::json j = report_json(s);
  ASSERT_TRUE(j.contains("moe"));
  EXPECT_EQ(j["moe"]["expert_tokens"], (std::vector<int64_t>{6, 0, 2, 12, 4}));
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

TEST_F(ReportTest, CommandPrintsTheSummary) {
  const auto p = sh(report(file_));
  ASSERT_EQ(p.code, 0) << p.out;
  for (const char* want :
       {"shardlm report: ", "0.1.0 (commit abc123def456)", "world=2 tp=1 pp=1 replicas=2",
        "shardlm run --model m --prompts p.jsonl --out r.h5", "completed (not interrupted)",
        "6 (4 ok, 2 errors)", "empty prompt: 1", "prompt of: 1", "stop: 3, error: 2, length: 1",
        "20 prompt + 11 output", "over 2.500 s wall", "4.4 tok/s", "12.4 tok/s", "2.40 req/s",
        "250.000    440.000    494.000    500.000",  // TTFT p50 p90 p99 max, ms
        "prefill 71.4% (10), decode 28.6% (4)", "mean 2.00", "max 5 used", "node-b",
        "100 B (1.07 KiB in all)"}) {
    EXPECT_NE(p.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << p.out;
  }
  // The TTFT p50 comes from the rows (0.25 s), not the bogus attribute (99 s).
  EXPECT_EQ(p.out.find("99000.000"), std::string::npos) << p.out;
}

TEST_F(ReportTest, CommandSaysWhenInterrupted) {
  const std::string f = (dir_ / "stopped.h5").string();
  write_sample(f, true, 15);
  const auto p = sh(report(f));
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("interrupted by signal 15"), std::string::npos) << p.out;
}

TEST_F(ReportTest, JsonHasTheFields) {
  const auto p = sh(std::string("(") + report(file_ + " --json") + " 2>/dev/null)");
  ASSERT_EQ(p.code, 0) << p.out;
  const nlohmann::json j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["file"], file_);
  EXPECT_EQ(j["run"]["git_commit"], "abc123def456");
  EXPECT_EQ(j["run"]["interrupted"], false);
  EXPECT_EQ(j["requests"]["total"], 6);
  EXPECT_EQ(j["requests"]["errors"], 2);
  EXPECT_EQ(j["requests"]["error_kinds"]["empty prompt"], 1);
  EXPECT_EQ(j["requests"]["finish_reasons"]["stop"], 3);
  EXPECT_EQ(j["requests"]["output_tokens"], 11);
  EXPECT_NEAR(j["throughput"]["output_tokens_per_s"].get<double>(), 4.4, kTol);
  EXPECT_NEAR(j["throughput"]["requests_per_s"].get<double>(), 2.4, kTol);
  EXPECT_NEAR(j["latency_s"]["ttft"]["p50"].get<double>(), 0.25, kTol);
  EXPECT_NEAR(j["latency_s"]["tpot"]["p90"].get<double>(), 0.44, kTol);
  EXPECT_NEAR(j["latency_s"]["e2e"]["p99"].get<double>(), 0.991, kTol);
  EXPECT_EQ(j["latency_s"]["e2e"]["n"], 4);
  EXPECT_EQ(j["steps"]["count"], 4);
  EXPECT_EQ(j["steps"]["kv_blocks_used_max"], 5);
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_NEAR(j["ranks"][0]["load_gb_per_s"].get<double>(), 4.0, kTol);
  EXPECT_NEAR(j["comm"]["pp_bytes_per_output_token"].get<double>(), 40.0, kTol);
  EXPECT_FALSE(j.contains("plots"));
}

TEST_F(ReportTest, MissingFileIsNamed) {
  const std::string missing = (dir_ / "nope.h5").string();
  const auto p = sh(report(missing));
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("cannot open result file '" + missing + "': no such file"), std::string::npos) << p.out;
}

TEST_F(ReportTest, NotHdf5IsNamed) {
  const std::string text = (dir_ / "prompts.jsonl").string();
  std::ofstream(text) << "{\"prompt\": \"hi\"}\n";
  const auto p = sh(report(text));
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("'" + text + "': not an HDF5 file"), std::string::npos) << p.out;
}

TEST_F(ReportTest, NoFileGiven) {
  const auto p = sh(report(""));
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("give the result file"), std::string::npos) << p.out;
}

// Without a usable Python the summary is still printed, with a clear note, and the exit code is 0.
TEST_F(ReportTest, PlotsWithoutPythonStillSummarise) {
  const auto p = sh("SHARDLM_PYTHON=/nonexistent/python3 " + report(file_ + " --plots " + (dir_ / "plots").string()));
  EXPECT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("6 (4 ok, 2 errors)"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("/nonexistent/python3 not found"), std::string::npos) << p.out;
}

// A plot script that finds no matplotlib exits 3: the report says so and still exits 0.
TEST_F(ReportTest, PlotsWithoutMatplotlibStillSummarise) {
  const std::string script = (dir_ / "fake_plot.sh").string();
  std::ofstream(script) << "echo 'plot_report.py: needs h5py and matplotlib' >&2\nexit 3\n";
  const auto p = sh("SHARDLM_PYTHON=sh SHARDLM_PLOT_SCRIPT=" + script + " " +
                    report(file_ + " --json --plots " + (dir_ / "plots").string()));
  EXPECT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("lacks h5py or matplotlib"), std::string::npos) << p.out;
  const auto j = sh("(SHARDLM_PYTHON=sh SHARDLM_PLOT_SCRIPT=" + script + " " +
                    report(file_ + " --json --plots " + (dir_ / "plots").string()) + " 2>/dev/null)");
  const nlohmann::json parsed = nlohmann::json::parse(j.out);
  EXPECT_TRUE(parsed["plots"]["written"].empty());
  EXPECT_NE(parsed["plots"]["problem"].get<std::string>().find("matplotlib"), std::string::npos);
}

TEST_F(ReportTest, PlotsArePngs) {
  if (sh("python3 -c 'import h5py, matplotlib'").code != 0) {
    GTEST_SKIP() << "python3 with h5py and matplotlib is not importable: --plots not checked";
  }
  const fs::path plots = dir_ / "plots";
  const auto p = sh(report(file_ + " --plots " + plots.string()));
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("plots (" + plots.string() + ")"), std::string::npos) << p.out;
  expect_pngs(plots, {"throughput.png", "latency_hist.png", "steps.png", "replicas.png"}, p.out);
}

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

// jobs/plot_report.py draws experts.png for the MoE run and not for the dense one.
TEST_F(ReportOfModelRuns, PlotsExpertsForMoeOnly) {
  if (sh("python3 -c 'import h5py, matplotlib'").code != 0) {
    GTEST_SKIP() << "python3 with h5py and matplotlib is not importable: --plots not checked";
  }
  const fs::path moe_plots = *dir_ / "moe-plots", dense_plots = *dir_ / "dense-plots";
  const auto p = sh(report(*moe_ + " --plots " + moe_plots.string()));
  ASSERT_EQ(p.code, 0) << p.out;
  expect_pngs(moe_plots, {"throughput.png", "latency_hist.png", "steps.png", "replicas.png", "experts.png"}, p.out);
  const auto q = sh(report(*dense_ + " --plots " + dense_plots.string()));
  ASSERT_EQ(q.code, 0) << q.out;
  EXPECT_TRUE(fs::exists(dense_plots / "steps.png")) << q.out;
  EXPECT_FALSE(fs::exists(dense_plots / "experts.png")) << q.out;
}

}  // namespace
}  // namespace shardlm::report
