// A step that mixes prefill chunks with single tokens (continuous batching: decode tokens beside
// new prompts' chunks) runs its chunks on the tensor-core prefill kernels and its single tokens on
// the paged decode kernels, which keep their fp32 arithmetic and split long contexts across
// blocks. The decode launch covers the whole step with this file's positions: a token in a run of
// two or more consecutive tokens with the same table start (one sequence's chunk) reads as
// padding (-1, a zero output at once), every other token keeps its position. The prefill launch
// then writes the runs' tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "host_device.h"

namespace shardlm::cuda {

// Whether token t of a step of T is in a run: its neighbour on either side has its table start.
SHARDLM_HD inline bool in_run(const int32_t* table_start, int64_t T, int64_t t) {
  return (t > 0 && table_start[t - 1] == table_start[t]) || (t + 1 < T && table_start[t + 1] == table_start[t]);
}

// out[t] = in_run(table_start, T, t) ? -1 : pos[t], for t < T (device memory).
void launch_single_token_positions(const int32_t* pos, const int32_t* table_start, int64_t T, int32_t* out,
                                   cudaStream_t stream);

}  // namespace shardlm::cuda
