// vLLM's logit controls and penalties on the device, on a copy of a step's logits that the sampler
// chooses from (kernels/cuda/sampling.h): a row that keeps only its allowed tokens starts barred
// (-inf), and each listed (row, token) logit becomes sampling::edited_logit of the raw one, the
// host sampler's rule (kernels/cpu/logit_edits.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sampling.h"
#include "sample_rules.h"

namespace shardlm::cuda {

// One edited token of one row (sampling::TokenEdit's fields).
struct LogitEditEntry {
  int32_t row = 0;
  int32_t token = 0;
  int32_t output_count = 0;  // -1: not seen
  float bias = 0.0f;
  int32_t allowed = 0;
};

// edited [R, V] (device) from logits [R, V] (device): every row of params[r].allowed_only filled
// with -inf, then each entry's (row, token) set to edited_logit of logits there with params[row]'s
// penalties; entries [n] (device), each (row, token) at most once, row < R and token < V. The
// rows edited holds otherwise must already be the logits' (a copy).
void launch_apply_logit_edits(const float* logits, float* edited, int64_t R, int64_t V, const SamplingRow* params,
                              const LogitEditEntry* entries, int64_t n, bool any_allowed_only, cudaStream_t stream);

}  // namespace shardlm::cuda
