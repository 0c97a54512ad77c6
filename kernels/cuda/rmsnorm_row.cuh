// The arithmetic of one RMSNorm row, shared by rmsnorm.cu (a thread block per row), the kernels
// that norm a row in a block of their own (latent_rope_cache_write.cu: MLA's latent) and those
// that norm short rows inside a warp (rope_kv_write.cu: Qwen3's per-head q / k norms), so that all
// give a row the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/block_reduce.cuh"

namespace shardlm::cuda {

// rmsnorm.cu's block size: the order of a row's sum of squares is fixed by it.
constexpr int kRmsnormThreads = 256;

// 1 / sqrt(var + eps) with IEEE sqrt and division (no fast-math), as the CPU computes it.
__device__ inline float inv_rms(float sumsq, int64_t dim, float eps) {
  const float var = sumsq / static_cast<float>(dim);
  return 1.0f / sqrtf(var + eps);
}

// out[i] = w[i] * (v[i] * r) of one dim-wide row v, by a kRmsnormThreads block, each thread
// touching only the elements it reads: first(i) gives v[i] for the sum of squares (and may store it,
// as add_rmsnorm's residual), again(i) gives it once more for the output, and put(i, value) stores
// output element i. Each thread sees its own elements only, so out may be the input.
template <class First, class Again, class Put>
__device__ inline void block_rmsnorm(const First& first, const Again& again, const float* w, int64_t dim, float eps,
                                     const Put& put) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = first(i);
    ss += v * v;
  }
  const float r = inv_rms(block_sum(ss), dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) put(i, w[i] * (again(i) * r));
}

// block_rmsnorm of the row x[0, dim) as it is: rmsnorm.cu's kernel and
// latent_rope_cache_write.cu norm rows with it.
template <class Put>
__device__ inline void block_rmsnorm_row(const float* x, const float* w, int64_t dim, float eps, const Put& put) {
  const auto load = [&](int64_t i) { return x[i]; };
  block_rmsnorm(load, load, w, dim, eps, put);
}

// The sum of squares of x[0, dim) that block_sum gives in a kRmsnormThreads block, where thread i
// adds x[i], x[i + kRmsnormThreads], ... in turn, computed by one warp: lane l plays the threads
// l, l + 32, ... of each of the block's warps, sums each such warp with warp_sum's butterfly, and
// then sums the warps' totals as block_sum's warp 0 does (lanes past the last warp add 0, which
// leaves every partial sum as it is). Every lane of the warp must call it; every lane gets the sum.
__device__ inline float warp_sumsq_in_rmsnorm_order(const float* x, int64_t dim) {
  constexpr int kWarps = kRmsnormThreads / 32;
  const int lane = threadIdx.x & 31;
  float ss[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    ss[w] = 0.0f;
    for (int64_t i = w * 32 + lane; i < dim; i += kRmsnormThreads) {
      const float v = x[i];
      ss[w] += v * v;
    }
  }
  warp_butterfly_n<FaddOp>(ss);  // each played warp's total, in every lane
  float mine = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    if (lane == w) mine = ss[w];
  return warp_sum(mine);
}

}  // namespace shardlm::cuda
