// Checks on the report `shardlm bench` prints: every part present, at the sizes asked for, with
// positive, finite figures. The figures themselves are the machine's: only their presence and
// form are checked.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

namespace shardlm::test {

// One entry per line of `out` that matches `line` (std::regex, searched): its first capture
// group, or "" when the pattern has none.
inline std::vector<std::string> bench_lines(const std::string& out, const std::string& line) {
  std::vector<std::string> v;
  const std::regex re(line);
  size_t at = 0;
  while (at < out.size()) {
    size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    std::smatch m;
    const std::string text = out.substr(at, end - at);
    if (std::regex_search(text, m, re)) v.push_back(m.size() > 1 ? m[1].str() : std::string());
    at = end + 1;
  }
  return v;
}

// `count` lines match `line`, and the figure each captures, if it captures one, is positive and
// finite.
inline void expect_bench_lines(const std::string& out, const std::string& line, size_t count) {
  const std::vector<std::string> v = bench_lines(out, line);
  EXPECT_EQ(v.size(), count) << "lines matching '" << line << "' in:\n" << out;
  for (const std::string& figure : v) {
    if (figure.empty()) continue;
    const double x = std::stod(figure);
    EXPECT_TRUE(std::isfinite(x) && x > 0) << line << ": " << figure << " in:\n" << out;
  }
}

struct BenchShape {
  bool gpu = false;
  int64_t prompt_len = 0, batch = 0, batch_in = 0, batch_out = 0;
  int64_t attention_context = 0;  // >= 4096 also gives the 4096 lines; 0: no attention part
  int64_t gemm_lines = 0;         // GPU: cuBLAS lines (the model's three shapes, and --peak-gemm's)
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
};

inline void expect_bench_report(const std::string& out, const BenchShape& s) {
  const std::string num = "([0-9]+\\.?[0-9]*(?:e[+-]?[0-9]+)?)";
  if (s.gpu) {
    expect_bench_lines(out, "^device: .*measured device-to-device copy " + num + " GB/s", 1);
    expect_bench_lines(out, "^  cuBLAS bf16 GEMM [0-9]+ x [0-9]+ x [0-9]+: " + num + " TFLOP/s", s.gemm_lines);
  } else {
    expect_bench_lines(out, "^machine: memory bandwidth " + num + " GB/s, fp32 FMA peak", 1);
  }
  expect_bench_lines(out, "^ceilings for this model: decode .* " + num + " tok/s;", 1);
  expect_bench_lines(out, "^KV cache budget " + num + " [KMG]iB \\(", 1);
  expect_bench_lines(out, "^prefill +" + std::to_string(s.prompt_len) + "-token prompt: +" + num + " tok/s", 1);
  expect_bench_lines(out, "^decode   batch 1: +" + num + " tok/s", 1);
  expect_bench_lines(out,
                     "^batched  " + std::to_string(s.batch) + " x \\(" + std::to_string(s.batch_in) + " in \\+ " +
                         std::to_string(s.batch_out) + " out\\): +" + num + " tok/s total",
                     1);
  expect_bench_lines(out,
                     "^sampling 64 rows x [0-9]+ vocab: +greedy " + num + ", .*\\+ min-p 0.05 and top-p 0.9 " + num +
                         ", greedy with penalties on 1024 seen tokens (" + num +
                         "|n/a \\(a vocabulary below the seen tokens\\)), greedy with [0-9]+ top logprobs " + num +
                         ", scored \\(prompt logprobs\\) " + num + ", scored with [0-9]+ top logprobs " + num +
                         ", greedy with 128 allowed tokens \\(4 biased\\) (" + num +
                         "|n/a \\(a vocabulary below the allowed tokens\\)) us/row",
                     1);
  const std::string heads = std::to_string(s.heads) + " heads / " + std::to_string(s.kv_heads) +
                            " KV heads, head_dim " + std::to_string(s.head_dim);
  const size_t contexts = s.attention_context > 4096 ? 2 : (s.attention_context > 0 ? 1 : 0);
  for (const char* dtype : {"fp32", "bf16", "fp8"}) {
    expect_bench_lines(out, "^attention decode \\(" + heads + ", " + dtype + " cache", contexts > 0 ? 1 : 0);
    expect_bench_lines(out, "^attention prefill \\(" + heads + ", " + dtype + " cache", contexts > 0 ? 1 : 0);
  }
  if (contexts > 0) {
    const int64_t shortest = std::min<int64_t>(4096, s.attention_context);
    for (int64_t T : {1, 8}) {
      expect_bench_lines(out, "^  " + std::to_string(T) + " x +" + std::to_string(shortest) + " positions: +" + num, 3);
      if (contexts == 2)
        expect_bench_lines(
            out, "^  " + std::to_string(T) + " x +" + std::to_string(s.attention_context) + " positions: +" + num, 3);
    }
    const int64_t chunk = std::min<int64_t>(512, s.attention_context);
    expect_bench_lines(out, "^  positions 0\\.\\." + std::to_string(chunk - 1) + " +: +" + num + " us", 3);
  }
  EXPECT_EQ(out.find("not timed"), std::string::npos) << out;
  for (const char* bad : {" nan", " inf", "-nan", "error"}) EXPECT_EQ(out.find(bad), std::string::npos) << bad << out;
}

// The --op-profile tables: a prefill step of the prompt, decode steps (the scenario's tokens but
// the first, which its prefill step samples), and the batched scenario's steps with prompt tokens
// and its decode steps (as many as the scheduling makes); in each, every dense layer's sections
// `layers` calls a step, every line's time not negative, and the shares adding up to the step
// (100% within the rounding of the lines).
inline void expect_op_profile(const std::string& out, int64_t prompt_len, int64_t decode_tokens, int64_t layers,
                              int64_t batch, int64_t batch_in, int64_t batch_out) {
  const std::string n = std::to_string(layers);
  const std::string batched = "op profile, batched " + std::to_string(batch) + " x \\(" + std::to_string(batch_in) +
                              " in \\+ " + std::to_string(batch_out) + " out\\), ";
  for (const std::string& title :
       {"^op profile, prefill " + std::to_string(prompt_len) + "-token prompt: 1 step, ",
        "^op profile, decode batch 1: " + std::to_string(decode_tokens - 1) + " steps, ",
        "^" + batched + "steps with prompt tokens: [0-9]+ steps?, ", "^" + batched + "decode steps: [0-9]+ steps?, "}) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex(title, std::regex::multiline))) << title << "\n" << out;
    const size_t at = static_cast<size_t>(m.position(0));
    const size_t end = out.find("(outside sections)", at);
    ASSERT_NE(end, std::string::npos) << out;
    const std::string table = out.substr(at, out.find('\n', end) - at);
    for (const char* section : {"attn qkv", "attn core", "attn out", "mlp gate/up", "mlp down"})
      EXPECT_EQ(bench_lines(table, std::string("^  ") + section + " +" + n + " ").size(), 1u) << section << "\n"
                                                                                              << table;
    double share = 0;
    for (const std::string& s : bench_lines(table, "^  .* +(-?[0-9.]+)%$")) {
      EXPECT_GE(std::stod(s), -0.05) << table;  // the time outside sections may round to -0.0
      share += std::stod(s);
    }
    EXPECT_NEAR(share, 100.0, 1.0) << table;
  }
}

}  // namespace shardlm::test
