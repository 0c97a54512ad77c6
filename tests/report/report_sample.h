// The result file the report tests read: six requests over two replicas written with ResultWriter
// from known rows (write_sample), the fixture that writes it, and a check that plots are PNGs.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

#include "common/cli_runner.h"
#include "io/result_writer.h"

namespace shardlm::report {

namespace fs = std::filesystem;

// Each of NAMES is a PNG of some size in DIR, and the report's output lists it.
inline void expect_pngs(const fs::path& dir, std::initializer_list<const char*> names, const std::string& out) {
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

inline RequestResult request(const std::string& id, int prompt, int output, FinishReason reason, double tq, double tf,
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

inline StepRecord step(int64_t n, int replica, int batch, int prefill, int decode, int kv, double t, double wall) {
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

inline RankRecord rank(int r, int replica, const std::string& host, int64_t load, double load_s, int64_t rss, int64_t tp,
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

// Six requests over two replicas, two of them errors, under a context limit of 5 tokens
// (max_model_len), at which r2 stopped for length:
//   r1: 3 prompt, 5 out, stop,   queued 0.0, first 0.1, done 0.5  TTFT 0.1 TPOT 0.1 e2e 0.5
//   r2: 2 prompt, 3 out, length, queued 0.0, first 0.3, done 0.7  TTFT 0.3 TPOT 0.2 e2e 0.7
//   r3: 4 prompt, 1 out, stop,   queued 0.5, first 0.7, done 0.7  TTFT 0.2 (no TPOT) e2e 0.2
//   r4: error "empty prompt"; r5: error "prompt of 10 tokens ..." (10 prompt tokens)
//   r6: 1 prompt, 2 out, stop,   queued 1.0, first 1.5, done 2.0  TTFT 0.5 TPOT 0.5 e2e 1.0
// The attributes hold a wrong ttft_p50_s on purpose: the report must compute from the rows.
inline void write_sample(const std::string& path, bool finished = true, int64_t signal = 0) {
  ResultWriter w(path);
  w.set_attr("version", std::string("0.1.0"));
  w.set_attr("git_commit", std::string("abc123def456"));
  w.set_attr("layout", std::string("world=2 tp=1 pp=1 replicas=2"));
  w.set_attr("command_line", std::string("shardlm run --model m --prompts p.jsonl --out r.h5"));
  w.set_attr("max_model_len", int64_t{5});
  w.append(request("r1", 3, 5, FinishReason::kStop, 0.0, 0.1, 0.5, 0));
  w.append(request("r2", 2, 3, FinishReason::kLength, 0.0, 0.3, 0.7, 1));
  w.append(request("r3", 4, 1, FinishReason::kStop, 0.5, 0.7, 0.7, 0));
  w.append(request("r4", 0, 0, FinishReason::kError, 0.2, 0.2, 0.2, 1, "line 4: empty prompt"));
  w.append(request("r5", 10, 0, FinishReason::kError, 0.3, 0.3, 0.3, 0,
                   "line 5: prompt of 10 tokens leaves no room to generate within the context of 5 tokens"));
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
    dir_ = test::fresh_dir("report");
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

}  // namespace shardlm::report
