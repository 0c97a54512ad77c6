#include "cuda/mma_fp8_tile.h"

#include "cuda/mma_fp8.cuh"

namespace shardlm::cuda {
namespace {

// Four codes from consecutive bytes, the first in the low byte (byte loads: any alignment).
__device__ inline uint32_t quad(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

__global__ void mma_fp8_tile_kernel(const uint8_t* a, const uint8_t* b, const float* c, float* d) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t fa[4] = {quad(&a[g * 32 + 4 * t]), quad(&a[(g + 8) * 32 + 4 * t]), quad(&a[g * 32 + 4 * t + 16]),
                          quad(&a[(g + 8) * 32 + 4 * t + 16])};
  const uint32_t fb[2] = {quad(&b[g * 32 + 4 * t]), quad(&b[g * 32 + 4 * t + 16])};
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  detail::mma_e4m3_16832(acc, fa, fb);
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

}  // namespace

void mma_fp8_tile(const uint8_t* a, const uint8_t* b, const float* c, float* d, cudaStream_t stream) {
  mma_fp8_tile_kernel<<<1, 32, 0, stream>>>(a, b, c, d);
}

}  // namespace shardlm::cuda
