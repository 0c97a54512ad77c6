#include "cuda/abs_max.h"
#include "cuda/block_reduce.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kThreads = 256;

// Each block folds its grid-stride share, then one atomic per block. Magnitudes are non-negative,
// and non-negative floats order as their bit patterns do, so an integer atomicMax is a float max.
__global__ void abs_max_kernel(const float* x, int64_t n, float* acc) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(x[i]));
  }
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(acc), __float_as_int(m));
}

}  // namespace

void launch_abs_max(const float* x, int64_t n, float* acc, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  abs_max_kernel<<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), kThreads, 0, stream>>>(x, n, acc);
}

}  // namespace shardlm::cuda
