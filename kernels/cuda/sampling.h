// Token selection on the device: per row of logits [R, V] (fp32), greedy or temperature sampling
// with top-k / top-p / min-p, drawing from Philox4x32-10 keyed by (seed, position) - the host
// sampler's rule (src/engine/sampler.h) - and the log-softmax of the raw logits at the chosen token.
//
// How the host's choice is reproduced without sorting: candidates are ordered by (logit descending,
// id ascending), a total order encoded as one 64-bit key per token (kernels/sample_rules.h), so
// "the first n candidates" is "the tokens whose key is <= some key q", and every prefix quantity
// the rule reads (count, weight) is a sum over such a set. Each cut (top-k size, top-p prefix, the
// sampled token: the first prefix whose weight exceeds u * mass) is found by a binary search over
// q (about 32 + log2(ties) passes over the row).
//
// The weights are integers (trunc(2^40 p)), so their sums are exact in any order: a tree of
// block reductions here, a walk over bands on the host. The one place the choice can differ is the
// probability itself: exp((l - max) / T) is fp64 exp rounded to fp32 on both sides, but the device
// exp and the host's (within 1.003 fp64 ulp of the exact value, kernels/cpu/vector_exp.h) may differ
// by an fp64 ulp, which changes the fp32 value about once in 2^29. min-p keeps through the last
// candidate with p >= min_p, as the host does (the host ignores candidates that weigh nothing, which
// are never drawn). Greedy follows the host's argmax exactly (ties to the lowest id, NaN never
// chosen, 0 for a row with nothing above -inf). Logprobs: fp64 sums in tree order, within ~1e-6 of
// the host's.
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
  // The row's penalties, and whether it keeps only its allowed tokens (kernels/cuda/logit_edits.h
  // applies them, before the sample kernel).
  float repetition_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  int32_t allowed_only = 0;
  // A scored row (prompt logprobs) takes this given token (>= 0) instead of a choice.
  int32_t target = -1;
  // The row's top_n most likely tokens of the raw row (candidate order: logit descending, ties to
  // the lower id, NaN never) and their logprobs go to [top_begin, top_begin + top_n).
  int32_t top_n = 0;
  int64_t top_begin = 0;
};

// logits [R, V]; params [R] (device); scratch [R, V] fp32 (device; the tempered probabilities);
// tokens [R] and logprobs [R] (device) receive the choice and log_softmax(logits row)[token].
// choice_logits, where not null, are the rows the choice is made on (the logits with their edits
// applied, kernels/cuda/logit_edits.h); the logprobs stay those of the raw logits. top_tokens and
// top_logprobs (device) receive the rows' top alternatives (may be null when no row has top_n): one
// pass over the row per alternative, each the smallest candidate key above the previous one's;
// -1 and NaN past the row's tokens that are not NaN.
void launch_sample(const float* logits, int64_t R, int64_t V, const SamplingRow* params, float* scratch,
                   int32_t* tokens, float* logprobs, cudaStream_t stream, const float* choice_logits = nullptr,
                   int32_t* top_tokens = nullptr, float* top_logprobs = nullptr);

// logprobs[r] = log_softmax(logits row r)[tokens[r]] (prompt logprobs, or a choice made elsewhere).
void launch_logprobs(const float* logits, int64_t R, int64_t V, const int32_t* tokens, float* logprobs,
                     cudaStream_t stream);

}  // namespace shardlm::cuda
