// Token selection from one row of logits: greedy, or temperature with top-k / top-p / min-p
// filtering, drawing from the counter-based stream of (seed, position).
#pragma once

#include <cstdint>
#include <vector>

#include "compute/backend.h"
#include "engine/logit_order.h"
#include "engine/sampling_params.h"

namespace shardlm {

struct Sample {
  int32_t token = 0;
  float logprob = 0;  // log-softmax of the raw (unscaled, unfiltered) logits at `token`
};

class Sampler {
 public:
  // logits: [vocab]; position: the index the sampled token will take in the sequence.
  Sample sample(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position);
  // The same choice for a row's settings (a SampleRow carries every field the choice reads).
  Sample sample(const float* logits, int64_t vocab, const SampleRow& row);

 private:
  LogitOrder sorter_;
  std::vector<int32_t> order_;  // scratch, reused across calls
  std::vector<float> probs_;
};

// The settings of a sequence's next token at `position` (the index it will take), for
// ComputeBackend::sample and Model::end_step_sampled.
SampleRow sample_row(const SamplingParams& p, int64_t position);

// log-softmax of logits at index i (cpu::log_softmax_at: fp32 exponentials, fp64 sum).
float log_softmax_at(const float* logits, int64_t vocab, int64_t i);

}  // namespace shardlm
