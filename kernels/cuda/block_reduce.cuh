// Block-wide reductions for kernels that give one thread block to a row. blockDim.x must be a
// multiple of 32 and at most 1024. Every thread of the block must call them (they synchronise), and
// every thread gets the result.
#pragma once

#include <cuda_runtime.h>

#include "cuda/warp_exchange.cuh"

namespace shardlm::cuda {

__device__ inline float warp_sum(float v) { return warp_butterfly<FaddOp>(v); }
__device__ inline float warp_max(float v) { return warp_butterfly<FmaxOp>(v); }

// The fixed order (lanes by xor butterfly, then warps 0..n-1) makes the sum the same from run to
// run for the same blockDim.
__device__ inline float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    float s = lane < nwarps ? partial[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    float s = lane < nwarps ? partial[lane] : -INFINITY;
    s = warp_max(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

}  // namespace shardlm::cuda
