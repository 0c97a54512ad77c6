// Token selection on the device: per row of logits [R, V] (fp32), greedy or temperature sampling
// with top-k / top-p / min-p, drawing from Philox4x32-10 keyed by (seed, position) - the host
// sampler's semantics (src/engine/sampler.cpp), with the same choice for the same logits, params,
// seed and position - and the log-softmax of the raw logits at the chosen token.
//
// How the host's sort is reproduced without sorting: candidates are ordered by (logit descending,
// id ascending), a total order encoded as one 64-bit key per token, so "the first n candidates"
// is "the tokens whose key is <= some key q", and every prefix quantity the host accumulates in
// sorted order (count, sum of probabilities, cumulative share) is a sum over such a set. Each cut
// (top-k size, top-p prefix, min-p prefix, the sampled token: the first prefix whose mass exceeds
// u * mass) is found by a binary search over q (about 32 + log2(ties) passes over the row).
//
// Where the result can differ from the host's, all at the level of rounding, documented here:
//  - the fp64 sums are taken in a fixed tree order, the host's sequentially in sorted order; they
//    differ by ~1e-16 relative, which moves a cut only when u * mass or top_p falls within that of
//    a cumulative boundary (u has 24 random bits: practically never);
//  - the probability exp((l - max) / T) is fp64 exp rounded to fp32 on both sides, but the device
//    and glibc exp may differ by one fp64 ulp, which changes the fp32 value about once in 2^29;
//  - min-p keeps the tokens with p >= min_p * p_max inside the prefix, the host the leading run of
//    them: the same set as long as p does not increase along the order, which holds for a
//    monotone exp.
// Logits must be finite for temperature > 0 (the host's comparison sort is undefined with NaN);
// greedy follows the host's argmax exactly (ties and NaN included: a NaN at index 0 wins, other
// NaNs never do). Logprobs: fp64 sums in tree order, within ~1e-6 of the host's.
//
// One thread block per row; every pass re-reads the row and its probabilities from global memory
// (L2-resident for vocabularies of a few hundred thousand). Correctness first: a greedy row costs
// two passes, a sampled row about 2 + 32 per active cut.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// One row's settings, the fields of shardlm::SamplingParams that the choice depends on, in the
// same types, plus the position of the token being sampled.
struct SamplingRow {
  double temperature = 0.0;  // <= 0: greedy
  double top_p = 1.0;        // >= 1: off
  double min_p = 0.0;        // <= 0: off
  int64_t top_k = 0;         // <= 0 or >= V: off
  uint64_t seed = 0;
  int64_t position = 0;      // index the sampled token takes in its sequence
};

// logits [R, V]; params [R] (device); scratch [R, V] fp32 (device; the tempered probabilities);
// tokens [R] and logprobs [R] (device) receive the choice and log_softmax(logits row)[token].
void launch_sample(const float* logits, int64_t R, int64_t V, const SamplingRow* params, float* scratch,
                   int32_t* tokens, float* logprobs, cudaStream_t stream);

// logprobs[r] = log_softmax(logits row r)[tokens[r]] (prompt logprobs, or a choice made elsewhere).
void launch_logprobs(const float* logits, int64_t R, int64_t V, const int32_t* tokens, float* logprobs,
                     cudaStream_t stream);

}  // namespace shardlm::cuda
