// The split of a stacked linear's output: y [M, W] (W the parts' widths summed, part p's columns
// after parts 0..p-1's) into one buffer per part, out[p] [M, width[p]], each part's bias added
// where it has one. CudaBackend::linear_parts runs a layer's q/k/v (or gate/up) projections as
// one GEMM on weights placed one after another, then this. Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

constexpr int kMaxSplitParts = 4;

struct SplitColumns {
  int n = 0;  // parts, 1..kMaxSplitParts
  int64_t width[kMaxSplitParts] = {};
  float* out[kMaxSplitParts] = {};
  const float* bias[kMaxSplitParts] = {};  // null: none
};

// out[p][m, c] = y[m, offset_p + c] (+ bias[p][c]): the fp32 add add_bias_rows makes after a linear.
void split_columns(const float* y, int64_t M, const SplitColumns& parts, cudaStream_t stream);

}  // namespace shardlm::cuda
