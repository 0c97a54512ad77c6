// The shardlm report command on the sample file (report_sample.h): its text, --json, the errors it
// names, and --plots with and without a Python that can draw them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "common/cli_runner.h"
#include "report_sample.h"

using shardlm::test::sh;

namespace shardlm::report {
namespace {

TEST_F(ReportTest, CommandPrintsTheSummary) {
  const auto p = sh(report(file_));
  ASSERT_EQ(p.code, 0) << p.out;
  for (const char* want : {"shardlm report: ",
                           "0.1.0 (commit abc123def456)",
                           "world=2 tp=1 pp=1 replicas=2",
                           "shardlm run --model m --prompts p.jsonl --out r.h5",
                           "completed (not interrupted)",
                           "6 (4 ok, 2 errors)",
                           "empty prompt: 1",
                           "prompt of: 1",
                           "stop: 3, error: 2, length: 1",
                           "5 tokens: 1 request stopped for length there",
                           "10 prompt + 11 output",
                           "over 2.500 s wall",
                           "4.4 tok/s",
                           "8.4 tok/s",
                           "2.40 req/s",
                           "250.000    440.000    494.000    500.000",  // TTFT p50 p90 p99 max, ms
                           "prefill 71.4% (10), decode 28.6% (4)",
                           "mean 2.00",
                           "max 5 used",
                           "node-b",
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
  EXPECT_EQ(j["requests"]["max_model_len"], 5);
  EXPECT_EQ(j["requests"]["stopped_at_context_limit"], 1);
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

// A command line that is not UTF-8 (a Latin-1 path) is JSON still: its bad bytes become U+FFFD.
TEST_F(ReportTest, JsonOfANonUtf8CommandLine) {
  const std::string f = (dir_ / "latin1.h5").string();
  write_sample(f);
  {
    ResultWriter w(f, 1, /*resume=*/true);
    w.set_attr("command_line", std::string("shardlm run --prompts caf\xe9.txt"));
    w.close();
  }
  const auto p = sh(std::string("(") + report(f + " --json") + " 2>/dev/null)");
  ASSERT_EQ(p.code, 0) << p.out;
  const nlohmann::json j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["run"]["command_line"], "shardlm run --prompts caf\xef\xbf\xbd.txt");
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

}  // namespace
}  // namespace shardlm::report
