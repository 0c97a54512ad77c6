#include "cuda/split_columns.h"

#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

// The parts travel by value in the kernel's parameters, so a captured launch keeps them.
__global__ void split_columns_kernel(const float* y, int64_t M, int64_t W, SplitColumns parts) {
  const int64_t n = M * W;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const int64_t m = i / W;
    int64_t c = i - m * W;
    int p = 0;
    while (p + 1 < parts.n && c >= parts.width[p]) c -= parts.width[p++];
    parts.out[p][m * parts.width[p] + c] = parts.bias[p] ? y[i] + parts.bias[p][c] : y[i];
  }
}

}  // namespace

void split_columns(const float* y, int64_t M, const SplitColumns& parts, cudaStream_t stream) {
  int64_t W = 0;
  for (int p = 0; p < parts.n; ++p) W += parts.width[p];
  if (M <= 0 || W <= 0) return;
  split_columns_kernel<<<detail::elementwise_blocks(M * W), detail::kElementwiseThreads, 0, stream>>>(y, M, W, parts);
}

}  // namespace shardlm::cuda
