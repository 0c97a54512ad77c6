// vLLM's logprobs and prompt_logprobs through the whole engine on stories260K, against the model's
// own logits computed here one prefix at a time (a separate forward for every position, no
// sampler): each prompt token's logprob, each output token's, and the N most likely tokens at each
// position, in double. Under a logit-row cap of a few rows (prompts scored over many steps) and
// a KV cache small enough to preempt and recompute sequences, the results stay those of one
// unconstrained run, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "common/engine_harness.h"
#include "common/model_steps.h"
#include "common/shared_data.h"

namespace shardlm {
namespace {

// log_softmax in double of the logits after `prefix`.
std::vector<double> reference_logprobs(Model& m, const std::vector<int32_t>& prefix) {
  const std::vector<float> logits = test::prefill_then_decode(m, {prefix});
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(x - mx);
  std::vector<double> lp(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) lp[i] = logits[i] - mx - std::log(sum);
  return lp;
}

// Checks n alternatives against the reference row: the n largest, most likely first.
void expect_alternatives(const std::vector<double>& ref, const int32_t* ids, const float* lps, int n,
                         const std::string& what, int* ties) {
  std::vector<int32_t> order(ref.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
  for (int k = 0; k < n; ++k) {
    EXPECT_NEAR(lps[k], ref[order[k]], 2e-5) << what << " alternative " << k;
    if (ids[k] != order[k]) {
      // fp32 and double may order two candidates within rounding of each other differently.
      EXPECT_NEAR(ref[ids[k]], ref[order[k]], 1e-5) << what << " alternative " << k;
      ++*ties;
    }
  }
}

std::vector<ParsedRequest> requests() {
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 403, 407, 261, 378}, {1, 307, 288, 399, 269, 368, 302, 263, 377, 267, 265, 282, 295}, {1}, {1, 403}};
  std::vector<ParsedRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int n : {0, 3}) {
      ParsedRequest r = test::ids_request("p" + std::to_string(i) + "n" + std::to_string(n), prompts[i], 6);
      r.overrides.prompt_logprobs = n;
      r.overrides.logprobs = n == 0 ? 2 : 20;
      r.overrides.ignore_eos = true;
      reqs.push_back(r);
    }
    // Sampled, beside them: its alternatives are of the raw logits too.
    ParsedRequest s = test::ids_request("s" + std::to_string(i), prompts[i], 6);
    s.overrides.temperature = 0.9;
    s.overrides.logprobs = 4;
    reqs.push_back(s);
  }
  return reqs;
}

TEST(PromptLogprobs, EveryPositionMatchesTheModelsLogits) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel engine_model(dir), ref_model(dir);
  const auto out = engine_model.run(requests());
  int ties = 0, checked = 0;
  for (const RequestResult& r : out.results) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    const int n_out = r.id[0] == 's' ? 4 : (r.id.back() == '0' ? 2 : 20);
    const int n_prompt = r.id[0] == 's' ? -1 : r.id.back() - '0';
    const size_t P = r.prompt_tokens.size();
    std::vector<int32_t> seq = r.prompt_tokens;
    ASSERT_EQ(r.top_token_ids.size(), r.output_tokens.size() * n_out) << r.id;
    for (size_t i = 0; i < r.output_tokens.size(); ++i) {
      const std::vector<double> ref = reference_logprobs(*ref_model.model, seq);
      const std::string what = r.id + " output " + std::to_string(i);
      EXPECT_NEAR(r.token_logprobs[i], ref[r.output_tokens[i]], 2e-5) << what;
      expect_alternatives(ref, r.top_token_ids.data() + i * n_out, r.top_logprobs.data() + i * n_out, n_out, what,
                          &ties);
      seq.push_back(r.output_tokens[i]);
      ++checked;
    }
    if (n_prompt < 0) {
      EXPECT_TRUE(r.prompt_logprobs.empty() && r.prompt_top_token_ids.empty()) << r.id;
      continue;
    }
    ASSERT_EQ(r.prompt_logprobs.size(), P) << r.id;
    ASSERT_EQ(r.prompt_top_token_ids.size(), P * n_prompt) << r.id;
    ASSERT_EQ(r.prompt_top_logprobs.size(), P * n_prompt) << r.id;
    EXPECT_TRUE(std::isnan(r.prompt_logprobs[0])) << r.id << ": the first prompt token has no context";
    for (int k = 0; k < n_prompt; ++k) EXPECT_EQ(r.prompt_top_token_ids[k], -1) << r.id;
    for (size_t p = 1; p < P; ++p) {
      const std::vector<double> ref = reference_logprobs(
          *ref_model.model, std::vector<int32_t>(r.prompt_tokens.begin(), r.prompt_tokens.begin() + p));
      const std::string what = r.id + " prompt " + std::to_string(p);
      EXPECT_NEAR(r.prompt_logprobs[p], ref[r.prompt_tokens[p]], 2e-5) << what;
      expect_alternatives(ref, r.prompt_top_token_ids.data() + p * n_prompt,
                          r.prompt_top_logprobs.data() + p * n_prompt, n_prompt, what, &ties);
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_LE(ties, 2);
}

// The same requests with 3 logit rows a step and a KV cache of a few blocks (sequences preempted
// and recomputed, their prompts scored over many steps): the results of the run above, bit for bit.
TEST(PromptLogprobs, RowCapAndPreemptionChangeNothing) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  test::LoadedModel a(dir), b(dir);
  const auto ref = a.run(requests());
  EngineConfig cfg;
  cfg.scheduler.max_seqs = 3;
  cfg.scheduler.max_batch_tokens = 8;
  cfg.scheduler.block_size = 4;
  const int64_t per_token = 2 * b.spec.num_layers * b.spec.num_kv_heads * b.spec.head_dim * 4;  // fp32 K and V
  cfg.kv_cache_bytes = per_token * 4 * 7;  // 7 blocks of 4 tokens: two long sequences do not fit together
  const auto tight = b.run(requests(), cfg);
  EXPECT_GT(tight.stats.preemptions, 0) << "the cache should be too small to hold every running sequence";
  ASSERT_EQ(tight.results.size(), ref.results.size());
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(), [](float u, float v) {
             return u == v || (std::isnan(u) && std::isnan(v));
           });
  };
  for (const RequestResult& r : ref.results) {
    const RequestResult& t = tight.by_id(r.id);
    EXPECT_EQ(t.output_tokens, r.output_tokens) << r.id;
    EXPECT_TRUE(same_bits(t.token_logprobs, r.token_logprobs)) << r.id;
    EXPECT_EQ(t.top_token_ids, r.top_token_ids) << r.id;
    EXPECT_TRUE(same_bits(t.top_logprobs, r.top_logprobs)) << r.id;
    EXPECT_TRUE(same_bits(t.prompt_logprobs, r.prompt_logprobs)) << r.id;
    EXPECT_EQ(t.prompt_top_token_ids, r.prompt_top_token_ids) << r.id;
    EXPECT_TRUE(same_bits(t.prompt_top_logprobs, r.prompt_top_logprobs)) << r.id;
  }
}

}  // namespace
}  // namespace shardlm
