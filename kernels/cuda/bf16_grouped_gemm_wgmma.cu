// See bf16_grouped_gemm_wgmma.h; grouped_gemm_wgmma_tile.cuh for the tile and its pipeline.
#include "cuda/bf16_grouped_gemm_wgmma.h"

#include <cstdint>

#include "cuda/grouped_gemm_wgmma_tile.cuh"
#include "cuda/wgmma.cuh"

namespace shardlm::cuda::detail {
namespace {

constexpr int kBK = kGemmStepBytes / 2;  // features a step

__global__ void __launch_bounds__(kGemmThreads, 2)
    bf16_grouped_gemm_wgmma_kernel(const uint16_t* x, const GemmTile* tiles, const int32_t* n_tiles, int N, int K,
                                   float* y) {
  extern __shared__ __align__(16) uint8_t smem_bf16_wgmma[];
  if (n_tiles != nullptr && static_cast<int>(blockIdx.x) >= *n_tiles) return;  // a routed launch's surplus
  const GemmTile t = tiles[blockIdx.x];
  const int n0 = static_cast<int>(blockIdx.y) * kGemmCols, steps = (K + kBK - 1) / kBK;
  const int row_bytes = 2 * K;  // K <= INT32_MAX / 2 (bf16_grouped_gemm_mma_fits)
  const auto* xb = reinterpret_cast<const uint8_t*>(x);
  uint8_t* stages = wgmma_aligned(smem_bf16_wgmma);
  const WgmmaWarp w = wgmma_warp();

  float acc[32];
#pragma unroll
  for (float& v : acc) v = 0.0f;

  // The pipeline of grouped_gemm_wgmma_tile.cuh.
  for (int f = 0; f < kWgmmaFetchAhead; ++f)
    fetch_gemm_stage<SwizzledStages>(xb, t, n0, N, row_bytes, f, steps, stages);
  for (int s = 0; s < steps; ++s) {
    const uint8_t* st = wgmma_step_ready(stages, s);
    wgmma_hold(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kGemmStepBytes; kk += 32)  // 16 features a product
      wgmma_bf16_m64n64k16(acc, wgmma_a_desc(st, kk), wgmma_b_desc(st, kk, w), true);
    wgmma_commit();
    fetch_gemm_stage<SwizzledStages>(xb, t, n0, N, row_bytes, s + kWgmmaFetchAhead, steps, stages);
    wgmma_wait<1>();
    wgmma_hold(acc);
  }
  wgmma_wait<0>();
  wgmma_hold(acc);
  store_wgmma_acc(acc, t, n0, N, w, y);
}

}  // namespace

void launch_bf16_grouped_gemm_wgmma(const uint16_t* x, const GemmTile* tiles, int64_t grid_tiles,
                                    const int32_t* n_tiles, int64_t N, int64_t K, float* y, cudaStream_t stream) {
  const int64_t n_blocks = (N + kGemmCols - 1) / kGemmCols;
  // Above the default 48 KB the kernel must opt in, once (a failure shows at launch).
  static const cudaError_t opted = cudaFuncSetAttribute(
      bf16_grouped_gemm_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWgmmaSmemBytes));
  (void)opted;
  bf16_grouped_gemm_wgmma_kernel<<<dim3(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(n_blocks)),
                                   kGemmThreads, kWgmmaSmemBytes, stream>>>(x, tiles, n_tiles, static_cast<int>(N),
                                                                            static_cast<int>(K), y);
}

}  // namespace shardlm::cuda::detail
