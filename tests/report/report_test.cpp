// shardlm report: a result file written with ResultWriter from known rows, read back and summarised
// (counts, percentiles, throughput checked against hand-computed values), then the command itself:
// text, --json, errors, and --plots.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/cli_runner.h"
#include "common/shared_data.h"
#include "core/error.h"
#include "io/result_writer.h"
#include "report/report_summary.h"
#include "report/result_file.h"

namespace fs = std::filesystem;
using shardlm::test::fresh_dir;
using shardlm::test::sh;

namespace shardlm::report {
namespace {

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
  for (const char* name : {"throughput.png", "latency_hist.png", "steps.png", "replicas.png"}) {
    const fs::path png = plots / name;
    ASSERT_TRUE(fs::exists(png)) << png << "\n" << p.out;
    EXPECT_GT(fs::file_size(png), 1000u) << png;
    std::ifstream in(png, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << png;
    EXPECT_NE(p.out.find(png.string()), std::string::npos) << "not listed: " << png << "\n" << p.out;
  }
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

}  // namespace
}  // namespace shardlm::report
