// See fp8_grouped_gemm_wgmma.h; grouped_gemm_wgmma_tile.cuh for the tile and its pipeline.
#include "cuda/fp8_grouped_gemm_wgmma.h"

#include <cstdint>

#include "cuda/grouped_gemm_wgmma_tile.cuh"
#include "cuda/wgmma.cuh"

namespace shardlm::cuda::detail {
namespace {

constexpr int kBK = 128;  // features a step (128 bytes): one scale block
static_assert(kBK == kGemmStepBytes, "a step is one scale block");

__global__ void __launch_bounds__(kGemmThreads, 2)
    fp8_grouped_gemm_wgmma_kernel(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const GemmTile* tiles,
                                  const int32_t* n_tiles, int N, int K, int scale_cols, int row_off, int col_block0,
                                  float* y) {
  extern __shared__ __align__(16) uint8_t smem_fp8_wgmma[];
  if (n_tiles != nullptr && static_cast<int>(blockIdx.x) >= *n_tiles) return;  // a routed launch's surplus
  const GemmTile t = tiles[blockIdx.x];
  const int n0 = static_cast<int>(blockIdx.y) * kGemmCols, steps = (K + kBK - 1) / kBK;
  uint8_t* stages = wgmma_aligned(smem_fp8_wgmma);
  const WgmmaWarp w = wgmma_warp();

  float acc[32], part[32];
#pragma unroll
  for (float& v : acc) v = 0.0f;

  // The pipeline of grouped_gemm_wgmma_tile.cuh, each step's products waited for at once: the
  // block's sum is promoted with its scales before the next block's products accumulate.
  for (int f = 0; f < kWgmmaFetchAhead; ++f) fetch_gemm_stage<SwizzledStages>(q, t, n0, N, K, f, steps, stages);
  for (int s = 0; s < steps; ++s) {
    const uint8_t* st = wgmma_step_ready(stages, s);
    wgmma_hold(part);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32)  // 32 features a product, the first from zero
      wgmma_e4m3_m64n64k32(part, wgmma_a_desc(st, kk), wgmma_b_desc(st, kk, w), kk != 0);
    wgmma_commit();
    fetch_gemm_stage<SwizzledStages>(q, t, n0, N, K, s + kWgmmaFetchAhead, steps, stages);

    // The scales while the products run. Rows past the tile and outputs past N take scale 0
    // (their codes were zeros).
    float rs[2], ws[8];
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int r = 16 * w.q + w.g + 8 * e2;
      rs[e2] = r < t.rows ? q_scales[s * q_scale_ld + t.row0 + r] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + 64 * w.h + 8 * j;  // its 8 outputs share a scale row (row_off % 8 == 0)
      ws[j] = n < N ? t.scale_inv[((n + row_off) / kBK) * scale_cols + col_block0 + s] : 0.0f;
    }

    wgmma_wait<0>();
    wgmma_hold(part);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] += part[i] * (rs[(i >> 1) & 1] * ws[i >> 2]);
  }
  store_wgmma_acc(acc, t, n0, N, w, y);
}

}  // namespace

void launch_fp8_grouped_gemm_wgmma(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const GemmTile* tiles,
                                   int64_t grid_tiles, const int32_t* n_tiles, const Fp8Weight& shape, float* y,
                                   cudaStream_t stream) {
  const int64_t n_blocks = (shape.N + kGemmCols - 1) / kGemmCols;
  // Above the default 48 KB the kernel must opt in, once (a failure shows at launch).
  static const cudaError_t opted = cudaFuncSetAttribute(
      fp8_grouped_gemm_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWgmmaSmemBytes));
  (void)opted;
  fp8_grouped_gemm_wgmma_kernel<<<dim3(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(n_blocks)),
                                  kGemmThreads, kWgmmaSmemBytes, stream>>>(
      q, q_scales, q_scale_ld, tiles, n_tiles, static_cast<int>(shape.N), static_cast<int>(shape.K),
      static_cast<int>(shape.scale_cols), static_cast<int>(shape.row_off), static_cast<int>(shape.col_off / kBK), y);
}

}  // namespace shardlm::cuda::detail
