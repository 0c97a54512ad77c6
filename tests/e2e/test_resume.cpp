// Never lose finished work: a run stopped by SIGTERM closes a valid file and exits non-zero; a run
// killed with SIGKILL leaves a readable file; --resume finishes either, and the final file holds
// each id once with the tokens of an uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <set>
#include <thread>

#include "common/cli_runner.h"
#include "common/shared_data.h"
#include "common/test_files.h"
#include "io/result_writer.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::Proc;
using test::sh;


using test::spawn;
using test::wait_exit;

class Resume : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = test::shared_path("models/stories260K");
    if (model_.empty()) GTEST_SKIP() << "reference data models/stories260K is absent";
    dir_ = test::fresh_dir("resume");
    std::string lines;
    for (int i = 0; i < 160; ++i) {
      lines += "{\"id\": \"r" + std::to_string(i) + "\", \"prompt\": \"Once upon a time\", \"max_tokens\": 120, " +
               "\"ignore_eos\": true, \"temperature\": 0.7}\n";
    }
    test::write_file(dir_ / "p.jsonl", lines);
    Proc full = sh(test::shardlm_bin() + " " + join(args("full.h5")));
    ASSERT_EQ(full.code, 0) << full.out;
    reference_ = test::read_run((dir_ / "full.h5").string());
    ASSERT_EQ(reference_.tokens.size(), 160u);
  }

  std::vector<std::string> args(const std::string& out, bool resume = false) {
    std::vector<std::string> a = {"run", "--model", model_, "--prompts", (dir_ / "p.jsonl").string(), "--out",
                                  (dir_ / out).string(), "--threads", "1", "--max-seqs", "2", "--flush-every", "2",
                                  "--seed", "4"};
    if (resume) a.push_back("--resume");
    return a;
  }
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
    return s;
  }

  // Runs until its progress line reports at least 6 finished requests (whatever the machine's
  // speed), then sends `sig`; returns the exit code. finished_at_signal_: the count last reported.
  int interrupt(const std::string& out, int sig, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> a = args(out);
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.begin(), test::shardlm_bin());
    a.push_back("--progress-interval");
    a.push_back("0.05");
    const std::string log = (dir_ / (out + ".log")).string();
    const pid_t pid = spawn(a, log);
    const std::regex done("replica 0: ([0-9]+)/");
    for (int i = 0; i < 600; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const std::string text = test::read_file(log);
      int finished = 0;
      for (std::sregex_iterator it(text.begin(), text.end(), done), end; it != end; ++it) {
        finished = std::max(finished, std::stoi((*it)[1]));
      }
      finished_at_signal_ = finished;
      if (finished >= 6) break;
    }
    kill(pid, sig);
    return wait_exit(pid);
  }

  void expect_complete(const std::string& out) {
    test::H5Reader h(dir_ / out);
    auto ids = h.strings("/requests/id");
    EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size()) << "an id appears twice";
    const test::RunOutput got = test::read_run((dir_ / out).string());
    EXPECT_EQ(got.tokens, reference_.tokens);
  }

  // The summary attributes count every session's rows: requests and output tokens are the file's,
  // and its tok/s is over the sessions' running time added up.
  void expect_summary_of_every_session(const std::string& out, int64_t sessions) {
    test::H5Reader h(dir_ / out);
    EXPECT_EQ(h.scalar_attr<int64_t>("sessions", H5T_NATIVE_INT64), sessions);
    EXPECT_EQ(h.scalar_attr<int64_t>("requests", H5T_NATIVE_INT64), 160);
    int64_t output = 0;
    for (const auto& [id, toks] : test::read_run((dir_ / out).string()).tokens) output += toks.size();
    EXPECT_EQ(h.scalar_attr<int64_t>("output_tokens", H5T_NATIVE_INT64), output);
    const double wall = h.scalar_attr<double>("wall_seconds", H5T_NATIVE_DOUBLE);
    const double before = h.scalar_attr<double>("wall_seconds_before", H5T_NATIVE_DOUBLE);
    EXPECT_GT(before, 0) << "the earlier sessions' running time";
    EXPECT_GT(wall, before);
    EXPECT_NEAR(h.scalar_attr<double>("output_tokens_per_s", H5T_NATIVE_DOUBLE), output / wall, 1e-6 * output / wall);
    EXPECT_EQ(h.scalar_attr<int64_t>("interrupted_by_signal", H5T_NATIVE_INT64), 0);
  }

  std::string model_;
  fs::path dir_;
  test::RunOutput reference_;
  int finished_at_signal_ = 0;
};

// The stopped run also writes its op profile (--op-profile); the resumed run, which is not
// profiled, replaces the previous run's /op_profile as it does /ranks: the file describes its last run.
TEST_F(Resume, SigtermClosesAValidFileAndResumeFinishes) {
  const int code = interrupt("term.h5", SIGTERM, {"--op-profile"});
  EXPECT_EQ(code, 128 + SIGTERM);
  const std::string log = test::read_file((dir_ / "term.h5.log").string());
  EXPECT_NE(log.find("stopped by signal 15"), std::string::npos) << log;
  size_t before;
  std::string first_start;
  double first_wall = 0;
  {
    test::H5Reader h(dir_ / "term.h5");
    ASSERT_TRUE(h.ok());
    before = h.rows("/requests/id");
    EXPECT_EQ(h.scalar_attr<int64_t>("interrupted_by_signal", H5T_NATIVE_INT64), SIGTERM);
    EXPECT_GT(h.rows("/op_profile/section"), 0u);
    first_start = h.string_attr("start_time");
    first_wall = h.scalar_attr<double>("wall_seconds", H5T_NATIVE_DOUBLE);
  }
  EXPECT_GT(before, 0u);
  EXPECT_LT(before, 160u) << "the run finished before the signal: make it longer";
  std::vector<std::string> a = args("term.h5", true);
  a.insert(a.end(), {"--progress-interval", "0.01"});
  Proc p = sh(test::shardlm_bin() + " " + join(a));
  ASSERT_EQ(p.code, 0) << p.out;
  // The progress line counts against what the file had left, not its every line.
  EXPECT_TRUE(std::regex_search(p.out, std::regex("replica 0: [0-9]+/" + std::to_string(160 - before) + " requests")))
      << p.out;
  expect_complete("term.h5");
  expect_summary_of_every_session("term.h5", 2);
  test::H5Reader h(dir_ / "term.h5");
  EXPECT_EQ(h.rows("/op_profile/section"), 0u) << "the stopped run's /op_profile outlived the resume";
  EXPECT_GT(h.rows("/ranks/rank"), 0u);
  EXPECT_EQ(h.string_attr("start_time"), first_start) << "the first session's start";
  EXPECT_DOUBLE_EQ(h.scalar_attr<double>("wall_seconds_before", H5T_NATIVE_DOUBLE), first_wall);
  EXPECT_NE(p.out.find("(over 2 sessions; " + std::to_string(before) + " requests from the earlier ones)"),
            std::string::npos)
      << p.out;
}

TEST_F(Resume, SigkillLosesAtMostWhatWasInFlight) {
  const int code = interrupt("kill.h5", SIGKILL);
  EXPECT_EQ(code, 128 + SIGKILL);
  size_t before;
  {
    test::H5Reader h(dir_ / "kill.h5");
    ASSERT_TRUE(h.ok()) << "the file of a killed run must stay readable";
    before = h.rows("/requests/id");
  }
  EXPECT_LT(before, 160u);
  // What was finished when the signal came is in the file, but for the one row a flush every 2
  // requests may still hold.
  ASSERT_GE(finished_at_signal_, 6);
  EXPECT_GE(before + 1, static_cast<size_t>(finished_at_signal_));
  Proc p = sh(test::shardlm_bin() + " " + join(args("kill.h5", true)));
  ASSERT_EQ(p.code, 0) << p.out;
  expect_complete("kill.h5");
  // The killed session wrote no wall_seconds: its running time is taken from its rows.
  expect_summary_of_every_session("kill.h5", 2);
}

// A file resumed by a run with other output-deciding settings (another seed here) would hold two
// runs' outputs under one config: the run refuses, naming the setting, and leaves the file as it was.
// A file another build wrote is resumed with a warning naming both builds: matching settings do not
// make its rows this build's.
TEST_F(Resume, ResumeOfAnotherBuildsFileSaysSo) {
  fs::copy_file(dir_ / "full.h5", dir_ / "older.h5");
  {
    ResultWriter w((dir_ / "older.h5").string(), 64, /*resume=*/true);
    w.set_attr("git_commit", std::string("0123456789ab"));
    w.set_attr("version", std::string("0.0.9"));
  }
  Proc p = sh(test::shardlm_bin() + " " + join(args("older.h5", true)));
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("warning: --resume " + (dir_ / "older.h5").string() +
                       ": its rows were written by shardlm 0.0.9 (commit 0123456789ab), this is"),
            std::string::npos)
      << p.out;
  Proc same = sh(test::shardlm_bin() + " " + join(args("older.h5", true)));
  ASSERT_EQ(same.code, 0) << same.out;
  EXPECT_EQ(same.out.find("were written by shardlm"), std::string::npos) << same.out;
}

TEST_F(Resume, ResumeWithOtherSettingsIsRefused) {
  fs::copy_file(dir_ / "full.h5", dir_ / "other.h5");
  std::vector<std::string> a = args("other.h5", true);
  const auto seed = std::find(a.begin(), a.end(), "--seed");
  ASSERT_NE(seed, a.end());
  *(seed + 1) = "5";
  Proc p = sh(test::shardlm_bin() + " " + join(a));
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("the file holds the outputs of a run with other settings"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("seed = 4 vs 5 (the file's vs this run's)"), std::string::npos) << p.out;
  // A penalty is such a setting (the file's run had none: the key is absent, read as none).
  std::vector<std::string> pen = args("other.h5", true);
  pen.insert(pen.end(), {"--repetition-penalty", "1.2"});
  Proc q = sh(test::shardlm_bin() + " " + join(pen));
  EXPECT_NE(q.code, 0);
  EXPECT_NE(q.out.find("repetition-penalty = (none) vs 1.2"), std::string::npos) << q.out;
  test::H5Reader h(dir_ / "other.h5");
  EXPECT_EQ(h.rows("/requests/id"), 160u);
  EXPECT_EQ(h.scalar_attr<int64_t>("sessions", H5T_NATIVE_INT64), 1);
}

TEST_F(Resume, ResumeOfACompleteFileRunsNothing) {
  fs::copy_file(dir_ / "full.h5", dir_ / "again.h5");
  Proc p = sh(test::shardlm_bin() + " " + join(args("again.h5", true)));
  ASSERT_EQ(p.code, 0) << p.out;
  test::H5Reader h(dir_ / "again.h5");
  EXPECT_EQ(h.rows("/requests/id"), 160u);
  EXPECT_EQ(h.scalar_attr<int64_t>("resumed_with_requests", H5T_NATIVE_INT64), 160);
  expect_complete("again.h5");
  expect_summary_of_every_session("again.h5", 2);
}

}  // namespace
}  // namespace shardlm
