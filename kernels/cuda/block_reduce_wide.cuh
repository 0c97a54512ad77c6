// Block-wide reductions of any shuffleable type (double, int64, uint64, ...) with any associative
// operator, for kernels that need more than the float sum / max of block_reduce.cuh: exact counts,
// fp64 sums, 64-bit ordering keys. Same contract: blockDim.x a multiple of 32 and at most 1024,
// every thread calls it, every thread gets the result. The order of combination is fixed (lanes by
// xor butterfly, then warps 0..n-1), so a floating-point result is the same from run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/warp_exchange.cuh"

namespace shardlm::cuda {

// Op: a stateless function object (it is made afresh where the lanes meet).
template <typename T, typename Op>
__device__ inline T warp_reduce(T v, Op) {
  return warp_butterfly<Op>(v);
}

// `identity` fills the lanes past the last warp (op(identity, x) == x).
template <typename T, typename Op>
__device__ inline T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  __shared__ T total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // partial[] and total may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    T s = lane < nwarps ? partial[lane] : identity;
    s = warp_reduce(s, op);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};

__device__ inline double block_sum_f64(double v) { return block_reduce(v, SumOp{}, 0.0); }
__device__ inline long long block_sum_i64(long long v) { return block_reduce(v, SumOp{}, 0LL); }
__device__ inline unsigned long long block_min_u64(unsigned long long v) {
  return block_reduce(v, MinOp{}, ~0ULL);
}
__device__ inline unsigned long long block_max_u64(unsigned long long v) { return block_reduce(v, MaxOp{}, 0ULL); }

}  // namespace shardlm::cuda
