// vLLM's repetition, frequency and presence penalties on the device, on a copy of a step's logits
// the sampler chooses from (kernels/cuda/sampling.h): each listed (row, token) logit becomes
// sampling::penalized_logit of it, the host sampler's rule (kernels/cpu/penalties.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sampling.h"

namespace shardlm::cuda {

// One seen token of one row: its count in that row's output (0: the prompt only).
struct PenaltyEntry {
  int32_t row = 0;
  int32_t token = 0;
  int32_t output_count = 0;
};

// logits [R, V] (device), changed in place at each entry's (row, token) with params[row]'s
// penalties; entries [n] (device), each (row, token) at most once, row < R and token < V.
void launch_apply_penalties(float* logits, int64_t V, const SamplingRow* params, const PenaltyEntry* entries, int64_t n,
                            cudaStream_t stream);

}  // namespace shardlm::cuda
