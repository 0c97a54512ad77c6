// Mixture-of-Experts routing: which experts each token goes to, and with what weight. Pure
// functions on host fp32 router logits [T, E] (the output of the router Linear), matching the
// Hugging Face reference implementations:
//
//   softmax top-k   Mixtral, Qwen2-MoE, Qwen3-MoE: p = softmax(logits) over all E experts, the k
//                   largest p chosen; Mixtral always renormalises the chosen p to sum to 1, Qwen
//                   only with norm_topk_prob (HF: topk_value /= topk_value.sum()).
//   sigmoid         DeepSeek-V3, Kimi K2: s = sigmoid(logits); the selection uses s + bias
//                   (e_score_correction_bias, may be absent), group-limited: the E experts form
//                   n_group consecutive groups, each scored by the sum of its two largest biased
//                   scores (its only score when a group holds one expert), the topk_group best
//                   groups are kept and the k best experts are taken from them. The weights are
//                   the unbiased s of the chosen experts, divided by (their sum + 1e-20) with
//                   norm_topk_prob, then multiplied by routed_scaling_factor.
//
// Ties are broken deterministically, lower index first (experts and groups alike): two equal
// scores pick the expert (group) with the smaller index. torch.topk leaves the order of ties
// unspecified, so on exact ties HF may choose differently; with real-valued logits ties do not
// happen in practice. Sums are accumulated in double and rounded once to float.
//
// The k chosen experts of a token are listed best first (by the selection score, ties lower
// index first); the combine does not depend on that order (it sums in ascending expert index).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_spec.h"

namespace shardlm {

struct Routing {
  int64_t T = 0, k = 0;
  std::vector<int32_t> experts;  // [T, k] chosen expert indices, best first
  std::vector<float> weights;    // [T, k] their routing weights
};

// Softmax over each row of logits [T, E], top-k; renormalise: divide the chosen probabilities by
// their sum. scale multiplies the final weights (1 for Mixtral / Qwen).
void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalise, double scale,
                        Routing* out);

// Sigmoid scores with optional selection bias [E] (may be null), group-limited top-k (n_group
// must divide E; topk_group <= n_group), weights from the unbiased scores.
void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t k, const float* bias, int64_t n_group,
                           int64_t topk_group, bool norm_topk_prob, double routed_scaling_factor, Routing* out);

// The routing the spec describes: softmax (renormalised when norm_topk_prob, and always for the
// Mixtral naming) or sigmoid group-limited (bias used only when score_correction_bias).
void route(const MoeSpec& m, const float* logits, int64_t T, const float* bias, Routing* out);

}  // namespace shardlm
