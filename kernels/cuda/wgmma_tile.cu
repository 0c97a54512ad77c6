#include "cuda/wgmma_tile.h"

#include <cstring>

#include "cuda/wgmma.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kTileBytes = 64 * detail::kWgmmaRowBytes;

__global__ void __launch_bounds__(128)
    wgmma_tile_kernel(const uint8_t* a, const uint8_t* b, int kk, bool fp8, float* d) {
  extern __shared__ __align__(16) uint8_t smem_wgmma_tile[];
  uint8_t* s = detail::wgmma_aligned(smem_wgmma_tile);
  const int t = static_cast<int>(threadIdx.x);
  for (int c = t; c < 2 * 64 * 8; c += 128) {  // 16-byte chunks: a's 64 rows, then b's
    const int r = c / 8 % 64, j = c % 8;
    std::memcpy(s + (c < 512 ? 0 : kTileBytes) + detail::swizzled_chunk(r, j),
                (c < 512 ? a : b) + r * detail::kWgmmaRowBytes + 16 * j, 16);
  }
  detail::fence_shared_for_wgmma();
  __syncthreads();
  float acc[32];
#pragma unroll
  for (float& v : acc) v = 0.0f;
  const uint64_t da = detail::wgmma_desc(detail::shared_window_address(s) + static_cast<uint32_t>(kk));
  const uint64_t db = detail::wgmma_desc(detail::shared_window_address(s + kTileBytes) + static_cast<uint32_t>(kk));
  detail::wgmma_hold(acc);
  detail::wgmma_fence();
  if (fp8)
    detail::wgmma_e4m3_m64n64k32(acc, da, db, false);
  else
    detail::wgmma_bf16_m64n64k16(acc, da, db, false);
  detail::wgmma_commit();
  detail::wgmma_wait<0>();
  detail::wgmma_hold(acc);
  const int lane = t & 31, q = t >> 5;
#pragma unroll
  for (int i = 0; i < 32; ++i)
    d[(16 * q + lane / 4 + 8 * (i % 4 / 2)) * 64 + 8 * (i / 4) + 2 * (lane % 4) + i % 2] = acc[i];
}

}  // namespace

void wgmma_tile(const uint8_t* a, const uint8_t* b, int kk, bool fp8, float* d, cudaStream_t stream) {
  wgmma_tile_kernel<<<1, 128, 2 * kTileBytes + detail::kWgmmaAtomBytes, stream>>>(a, b, kk, fp8, d);
}

}  // namespace shardlm::cuda
