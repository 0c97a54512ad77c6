#include "cuda/mma_bf16_tile.h"

#include "cuda/ldmatrix.cuh"
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

// Lane l names row l % 8 of matrix l / 8: for a, matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15),
// rows first; for b, (k 0-7 | 8-15) x (n 0-7 | 8-15), k first, so registers 0, 1 are the first
// 8 outputs' fragment and 2, 3 the next 8's.
__global__ void mma_bf16_tile_ldmatrix_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d,
                                              int pitch) {
  extern __shared__ __align__(16) uint16_t smem_tile[];
  uint16_t* sa = smem_tile;
  uint16_t* sb = sa + 16 * pitch;
  for (int i = threadIdx.x; i < 16 * 16; i += 32) {
    sa[(i / 16) * pitch + i % 16] = a[i];
    sb[(i / 16) * pitch + i % 16] = b[i];
  }
  __syncwarp();
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r = lane & 7, m = lane >> 3;
  uint32_t fa[4], fb[4];
  detail::ldmatrix_x4(fa, sa + (r + 8 * (m & 1)) * pitch + 8 * (m >> 1));
  detail::ldmatrix_x4_trans(fb, sb + (r + 8 * (m & 1)) * pitch + 8 * (m >> 1));
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const uint32_t b2[2] = {fb[2 * nt], fb[2 * nt + 1]};
    const int n = 8 * nt + 2 * t;
    float acc[4] = {c[g * 16 + n], c[g * 16 + n + 1], c[(g + 8) * 16 + n], c[(g + 8) * 16 + n + 1]};
    detail::mma_bf16_16816(acc, fa, b2);
    d[g * 16 + n] = acc[0];
    d[g * 16 + n + 1] = acc[1];
    d[(g + 8) * 16 + n] = acc[2];
    d[(g + 8) * 16 + n + 1] = acc[3];
  }
}

}  // namespace

void mma_bf16_tile_ldmatrix(const uint16_t* a, const uint16_t* b, const float* c, float* d, int pitch,
                            cudaStream_t stream) {
  mma_bf16_tile_ldmatrix_kernel<<<1, 32, 2 * 16 * pitch * sizeof(uint16_t), stream>>>(a, b, c, d, pitch);
}

void mma_bf16_tile(const uint16_t* a, const uint16_t* b, const float* c, float* d, cudaStream_t stream) {
  mma_bf16_tile_kernel<<<1, 32, 0, stream>>>(a, b, c, d);
}

}  // namespace shardlm::cuda
