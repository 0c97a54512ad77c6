// Launch geometry shared by the elementwise kernels of this directory (not part of the launcher
// interface).
#pragma once

#include <cstdint>

namespace shardlm::cuda::detail {

constexpr int kElementwiseThreads = 256;

// Grid for a grid-stride loop over n elements: enough blocks to cover n once, capped so the grid
// stays within the hardware limit; the kernel's stride loop covers the rest.
inline unsigned elementwise_blocks(int64_t n) {
  const int64_t want = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  const int64_t cap = int64_t{1} << 20;
  return static_cast<unsigned>(want < cap ? want : cap);
}

__device__ inline int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace shardlm::cuda::detail
