// Token selection from one row of logits: greedy, or temperature with top-k / top-p / min-p
// filtering, drawing from the counter-based stream of (seed, position), after vLLM's repetition,
// frequency and presence penalties where the row has them (greedy included, as in vLLM).
//
// The rule, which the CUDA sampler (kernels/cuda/sampling.h) follows too, on the logits after the
// row's penalties (sampling::penalized_logit on each token it has seen): candidates in order of
// logit (descending, ties by id), each with probability p = exp((logit - max) * (1 / T)) rounded to
// float (1 for the first) and weight trunc(2^40 p) (kernels/sample_rules.h). Then, on the exact
// integer sums of the weights:
//   top-k keeps the first k;
//   top-p the shortest prefix whose weight W has W >= top_p * M, M the kept weight (as doubles);
//   min-p keeps through the last candidate with p >= min_p;
//   the draw is the first candidate whose cumulative weight exceeds u * M, u = uniform_at(seed,
//   position).
// A row whose largest logit is not finite, or a temperature whose inverse is not, takes the
// argmax.
#pragma once

#include <cstdint>
#include <vector>

#include "compute/backend.h"
#include "engine/candidate_bands.h"
#include "engine/sampling_params.h"

namespace shardlm {

struct Sample {
  int32_t token = 0;
  float logprob = 0;  // log-softmax of the raw (unscaled, unfiltered) logits at `token`
};

class Sampler {
 public:
  // logits: [vocab]; position: the index the sampled token will take in the sequence. p's
  // penalties and logit controls are not applied here: they read the row's token edits, which the
  // SampleRow form takes.
  Sample sample(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position);
  // The same choice for a row's settings (a SampleRow carries every field the choice reads), made
  // on the row with its edits applied (kernels/cpu/logit_edits.h) when it has any: edits is the
  // step's TokenEdit list the row indexes. The logprob is still of the raw row (vLLM's default
  // logprobs mode). A scored row (row.target >= 0) takes its given token.
  Sample sample(const float* logits, int64_t vocab, const SampleRow& row, const TokenEdit* edits = nullptr);

 private:
  // The choice alone. greedy_max, where not null, receives the row's maximum when the choice is
  // greedy (argmax_logit's, which log_softmax_at can take) and is left alone otherwise.
  int32_t choose(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position, float* greedy_max);

  CandidateBands bands_;          // scratch, reused across calls
  std::vector<float> edited_;     // the edited row
};

// The settings of a sequence's next token at `position` (the index it will take), for
// ComputeBackend::sample and Model::end_step_sampled.
SampleRow sample_row(const SamplingParams& p, int64_t position);

// A row's top_n most likely tokens of the raw logits and their logprobs (cpu::top_logprobs), at
// [row.top_begin, + row.top_n) of the step's top arrays; nothing for a row without top_n.
void write_top_logprobs(const float* logits, int64_t vocab, const SampleRow& row, int32_t* top_tokens,
                        float* top_logprobs);

// log-softmax of logits at index i (cpu::log_softmax_at: fp32 exponentials, fp64 sum).
float log_softmax_at(const float* logits, int64_t vocab, int64_t i);

}  // namespace shardlm
