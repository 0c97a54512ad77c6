// The temperature sampler's rules that the host (src/engine/sampler.cpp) and the device
// (kernels/cuda/sampling.cu) samplers share, in a header both compilers build, so that the two
// choose the same token from the same probabilities.
//
// Candidates are ordered by logit descending, ties by ascending id: a total order, one 64-bit key
// per token. Each candidate weighs its tempered probability p = exp((logit - max) * (1 / T)) (a
// float in [0, 1], 1 for the first) in fixed point, trunc(p * 2^40), so every sum the sampler
// takes (the mass of a prefix, a cumulative share) is an exact integer: the same in any order of
// addition, sequential on the host or a tree of reductions on the device. 2^-40 of the most likely
// token is far below what the 24-bit uniform draw resolves (2^-24 of the mass).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace shardlm::sampling {

// Weights sum below 2^63 for vocabularies up to this.
constexpr int64_t kMaxVocab = int64_t{1} << 22;

// The position of token `id` in the candidate order: smaller is earlier. NaN ranks as -inf; -0
// and +0 are equal.
SHARDLM_HD inline uint64_t candidate_key(float v, uint32_t id) {
  if (v != v) v = -INFINITY;
  if (v == 0.0f) v = 0.0f;
#ifdef __CUDA_ARCH__
  const uint32_t u = __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
#endif
  // Negative floats order reversed by their bits, non-negative ones directly: this is ascending
  // in v, its complement descending.
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(~ascending) << 32) | id;
}

// A candidate's weight from its tempered probability p: 0 for p = 0 or NaN.
SHARDLM_HD inline int64_t weight(float p) { return p > 0.0f ? static_cast<int64_t>(p * 0x1p40f) : 0; }

// One token of a sample row whose logit changes before the choice: a token the sequence has seen
// (its count in the output; 0: the prompt only), a biased one, an allowed one, or any of these.
struct TokenEdit {
  int32_t token = 0;
  int32_t output_count = 0;  // -1: not seen (no penalty applies)
  float bias = 0.0f;         // added first (logit_bias; -inf bars a stop token before min_tokens)
  int32_t allowed = 0;       // 1: in the request's allowed_token_ids (what a row with allowed_only keeps)
};

// vLLM's penalties on the logit of a token the sequence has seen, in fp32 and in its order:
// repetition (on prompt and output tokens: a positive logit divided, any other multiplied), then
// frequency times the token's count in the output, then presence (output tokens only). Built
// without fused multiply-adds on both sides (-ffp-contract=off, --fmad=false), as vLLM's separate
// tensor ops round each step.
SHARDLM_HD inline float penalized_logit(float logit, float repetition, float frequency, float presence,
                                        int32_t output_count) {
  float l = logit > 0.0f ? logit / repetition : logit * repetition;
  if (output_count > 0) {
    l -= frequency * static_cast<float>(output_count);
    l -= presence;
  }
  return l;
}

// An edited token's logit, in vLLM's sampler order: the allowed_token_ids mask (a row that keeps
// only its allowed tokens gives any other -inf), then min_tokens and logit_bias (the bias: -inf
// for a barred stop token, +b for a biased one, in fp32), then the penalties of a seen token.
SHARDLM_HD inline float edited_logit(float logit, const TokenEdit& e, bool allowed_only, float repetition,
                                     float frequency, float presence) {
  if (allowed_only && !e.allowed) return -INFINITY;
  float l = e.bias != 0.0f ? logit + e.bias : logit;
  if (e.output_count >= 0) l = penalized_logit(l, repetition, frequency, presence, e.output_count);
  return l;
}

}  // namespace shardlm::sampling
