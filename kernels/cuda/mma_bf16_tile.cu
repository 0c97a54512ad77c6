#include "cuda/mma_bf16_tile.h"

#include "cuda/mma_bf16.cuh"

namespace shardlm::cuda {
namespace {

__device__ inline uint32_t pair(const uint16_t* lo_hi_0, const uint16_t* lo_hi_1) {
  return static_cast<uint32_t>(*lo_hi_0) | (static_cast<uint32_t>(*lo_hi_1) << 16);
}

__global__ void mma_bf16_tile_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t fa[4] = {pair(&a[g * 16 + 2 * t], &a[g * 16 + 2 * t + 1]),
                          pair(&a[(g + 8) * 16 + 2 * t], &a[(g + 8) * 16 + 2 * t + 1]),
                          pair(&a[g * 16 + 2 * t + 8], &a[g * 16 + 2 * t + 9]),
                          pair(&a[(g + 8) * 16 + 2 * t + 8], &a[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t fb[2] = {pair(&b[(2 * t) * 8 + g], &b[(2 * t + 1) * 8 + g]),
                          pair(&b[(2 * t + 8) * 8 + g], &b[(2 * t + 9) * 8 + g])};
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  detail::mma_bf16_16816(acc, fa, fb);
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

}  // namespace

void mma_bf16_tile(const uint16_t* a, const uint16_t* b, const float* c, float* d, cudaStream_t stream) {
  mma_bf16_tile_kernel<<<1, 32, 0, stream>>>(a, b, c, d);
}

}  // namespace shardlm::cuda
