// Checks that sharded runs give the single-rank result: the same tokens, and log-probabilities of
// the chosen tokens within kLogprobTol (tensor and expert parallelism sum partial products in
// another order, so logits differ in the last bits), or kBf16CacheLogprobTol when a run keeps a
// bf16 KV cache: there a key or value whose fp32 result differs in its last bit can round to the
// neighbouring bf16 (2^-8 apart). Measured: up to 2.8e-4 on the random tiny models, 5.4e-3 on one
// request of stories260K at tp 2; the tokens stayed the same. kFp8CacheLogprobTol for an fp8 cache,
// whose neighbouring codes are 2^-4 apart, so one flip moves a value 16 times as far as in bf16
// (measured: 3.3e-4 on stories260K at tp 2, 4.5e-6 on the Kimi-K2-shaped model at dp 2 tp 2 ep 4):
// twice the bf16 tolerance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/test_files.h"

namespace shardlm::test {

constexpr float kLogprobTol = 1e-4f;
constexpr float kBf16CacheLogprobTol = 1e-2f;
constexpr float kFp8CacheLogprobTol = 2e-2f;

// The tolerance for two runs, from the narrower of their caches.
inline float logprob_tol(const RunOutput& a, const RunOutput& b) {
  if (a.kv_dtype == "fp8" || b.kv_dtype == "fp8") return kFp8CacheLogprobTol;
  if (a.kv_dtype == "bf16" || b.kv_dtype == "bf16") return kBf16CacheLogprobTol;
  return kLogprobTol;
}

// Prompts of several lengths (some longer than a sliding window of 64), greedy and sampled, some
// penalized, some with top logprobs and prompt logprobs, some with vLLM's logit controls.
inline void write_layout_prompts(const std::filesystem::path& p, int n, bool long_prompts) {
  std::string s;
  std::string allowed = "[";  // 128 of every model's 512 or more tokens
  for (int t = 256; t < 384; ++t) allowed += std::to_string(t) + (t + 1 < 384 ? ", " : "]");
  const char* starts[] = {"Once upon a time", "The little dog ran", "Lily and Ben went to the park", "One day"};
  for (int i = 0; i < n; ++i) {
    std::string prompt = starts[i % 4];
    if (long_prompts && i % 3 == 0) {
      for (int k = 0; k < 12; ++k) prompt += " and then the sun came out";
    }
    // Every third request penalized (greedy or sampled): its seen tokens travel with the step to
    // wherever the logits end.
    s += "{\"id\": \"q" + std::to_string(i) + "\", \"prompt\": \"" + prompt +
         "\", \"max_tokens\": " + std::to_string(6 + 3 * i) + (i % 2 ? ", \"temperature\": 0.8" : "") +
         (i % 3 == 2 ? ", \"repetition_penalty\": 1.3, \"frequency_penalty\": 0.4, \"presence_penalty\": 0.2" : "") +
         // Top alternatives travel back with the choices; prompt logprobs add a scored row per
         // prompt position (a long prompt's over several steps).
         (i % 4 == 1 ? ", \"logprobs\": 3" : "") + (i % 4 == 3 ? ", \"prompt_logprobs\": 2, \"logprobs\": 1" : "") +
         // vLLM's logit controls travel as the row's token edits, beside the seen tokens.
         // On greedy requests: a sampled one that takes a biased or allowed token of low probability
         // leaves the likely path, where rounding (a bf16 wire) moves the logprobs by more.
         (i % 10 == 2 ? ", \"logit_bias\": {\"263\": 2.5, \"282\": -3, \"300\": 1}" : "") +
         (i % 10 == 4 ? ", \"allowed_token_ids\": " + allowed + ", \"min_tokens\": 2" : "") + "}\n";
  }
  write_file(p, s);
}

// Logprobs of tokens other than the chosen one (prompt tokens, alternatives): a perturbation of the
// logits moves them in full, where the chosen token's (near probability 1) cancels it, so they are
// compared within 2 tol x max(1, |logprob|). Measured with a bf16 cache: 0.052 at a prompt token of
// logprob -5.0 (stories260K, tp 2; the bf16 cache itself moves it by 0.047 from an fp32 cache's),
// 1.04e-2 of |logprob|.
inline float other_token_tol(float tol, float lp) { return 2 * tol * std::max(1.0f, std::fabs(lp)); }

// Logprobs position by position within other_token_tol (NaN where the other has NaN); ids the same
// where their logprobs are further than that from their neighbours' (nearer, sharded sums may swap
// them).
inline void expect_same_logprobs(const std::vector<float>& la, const std::vector<float>& lb, float tol,
                                 const std::string& what) {
  ASSERT_EQ(la.size(), lb.size()) << what;
  for (size_t i = 0; i < la.size(); ++i) {
    if (std::isnan(la[i]) || std::isnan(lb[i])) {
      EXPECT_EQ(std::isnan(la[i]), std::isnan(lb[i])) << what << " at " << i;
    } else {
      EXPECT_LE(std::fabs(la[i] - lb[i]), other_token_tol(tol, la[i])) << what << " at " << i;
    }
  }
}

inline void expect_same_alternatives(const std::vector<int32_t>& ia, const std::vector<float>& la,
                                     const std::vector<int32_t>& ib, const std::vector<float>& lb, size_t per_row,
                                     float tol, const std::string& what) {
  expect_same_logprobs(la, lb, tol, what);
  ASSERT_EQ(ia.size(), ib.size()) << what;
  for (size_t i = 0; i < ia.size(); ++i) {
    const size_t k = i % per_row;
    const float t = 2 * other_token_tol(tol, la[i]);
    const bool near_prev = k > 0 && std::fabs(la[i] - la[i - 1]) <= t;
    const bool near_next = k + 1 < per_row && std::fabs(la[i] - la[i + 1]) <= t;
    if (!near_prev && !near_next) {
      EXPECT_EQ(ia[i], ib[i]) << what << " alternative " << i;
    }
  }
}

inline void expect_same_run(const RunOutput& a, const RunOutput& b, const std::string& what) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size()) << what;
  for (const auto& [id, toks] : a.tokens) {
    ASSERT_TRUE(b.tokens.count(id)) << what << " " << id;
    EXPECT_EQ(toks, b.tokens.at(id)) << what << " request " << id;
    EXPECT_TRUE(b.errors.at(id).empty()) << what << " " << b.errors.at(id);
    const auto& la = a.logprobs.at(id);
    const auto& lb = b.logprobs.at(id);
    ASSERT_EQ(la.size(), lb.size()) << what << " " << id;
    float worst = 0;
    for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, std::fabs(la[i] - lb[i]));
    EXPECT_LE(worst, logprob_tol(a, b)) << what << " request " << id;
    const float tol = logprob_tol(a, b);
    const std::string req = what + " request " + id;
    if (!toks.empty() && !a.top_ids.at(id).empty()) {
      expect_same_alternatives(a.top_ids.at(id), a.top_lps.at(id), b.top_ids.at(id), b.top_lps.at(id),
                               a.top_ids.at(id).size() / toks.size(), tol, req + " top logprobs");
    }
    expect_same_logprobs(a.prompt_lps.at(id), b.prompt_lps.at(id), tol, req + " prompt logprobs");
    if (!a.prompt_lps.at(id).empty() && !a.prompt_top_ids.at(id).empty()) {
      expect_same_alternatives(a.prompt_top_ids.at(id), a.prompt_top_lps.at(id), b.prompt_top_ids.at(id),
                               b.prompt_top_lps.at(id), a.prompt_top_ids.at(id).size() / a.prompt_lps.at(id).size(),
                               tol, req + " prompt top logprobs");
    }
  }
}

// One sharded run: its rank count and its layout flags ("--tp 2 --pp 2").
struct LayoutRun {
  int ranks;
  std::string flags;
};

// Runs MODEL on one rank and then in every layout, on the same `prompts` prompts; every layout
// must give the single-rank result. Returns the path of each layout's output, in order.
inline std::vector<std::string> check_layout_runs(const std::string& model, const std::vector<LayoutRun>& runs,
                                                  bool long_prompts, const std::string& tag,
                                                  const std::string& common_flags = "", int prompts = 12) {
  std::filesystem::path d = fresh_dir("layouts-" + tag);
  write_layout_prompts(d / "p.jsonl", prompts, long_prompts);
  const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                             " --threads 1 -q --seed 3 --max-seqs 5 --max-batch-tokens 48 --comm-timeout 120" + common_flags;
  std::vector<std::string> outs;
  Proc one = sh(shardlm_bin() + common + " --out " + (d / "one.h5").string());
  EXPECT_EQ(one.code, 0) << one.out;
  if (one.code != 0) return outs;
  const RunOutput ref = read_run((d / "one.h5").string());
  if (prompts >= 4) {
    // The requests that asked for them have their alternatives and prompt logprobs.
    EXPECT_EQ(ref.top_ids.at("q1").size(), 3 * ref.tokens.at("q1").size()) << tag;
    EXPECT_EQ(ref.top_ids.at("q3").size(), ref.tokens.at("q3").size()) << tag;
    EXPECT_FALSE(ref.prompt_lps.at("q3").empty()) << tag;
    EXPECT_EQ(ref.prompt_top_ids.at("q3").size(), 2 * ref.prompt_lps.at("q3").size()) << tag;
    EXPECT_TRUE(ref.prompt_lps.at("q0").empty()) << tag;
  }
  if (prompts >= 5) {
    // The allowed tokens held in the single rank's run too.
    for (int32_t t : ref.tokens.at("q4")) EXPECT_TRUE(t >= 256 && t < 384) << tag << ": q4 token " << t;
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const LayoutRun& l = runs[i];
    const std::string out = (d / ("layout" + std::to_string(i) + ".h5")).string();
    Proc p = sh(mpirun(l.ranks) + shardlm_bin() + common + " " + l.flags + " --out " + out);
    EXPECT_EQ(p.code, 0) << l.flags << "\n" << p.out;
    if (p.code != 0) continue;
    expect_same_run(ref, read_run(out), tag + " " + l.flags);
    outs.push_back(out);
  }
  return outs;
}

}  // namespace shardlm::test
