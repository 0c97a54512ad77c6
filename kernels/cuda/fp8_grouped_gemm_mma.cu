// See fp8_grouped_gemm_mma.h for the scheme; mma_fp8.cuh for the fragment layouts used below.
#include "cuda/fp8_grouped_gemm_mma.h"

#include <climits>
#include <cstdint>

#include "cuda/fp8_grouped_gemm_wgmma.h"
#include "cuda/grouped_gemm_tile.cuh"
#include "cuda/mma_fp8.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kThreads = detail::kGemmThreads;
constexpr int kBM = kFp8GemmTileRows, kBN = kFp8GemmTileCols;
constexpr int kBK = 128;  // features a step (128 bytes): one scale block
static_assert(kBM == detail::kGemmRows && kBN == detail::kGemmCols && kBK == detail::kGemmStepBytes,
              "the tile of grouped_gemm_tile.cuh");

__global__ void __launch_bounds__(kThreads, 2)
    fp8_grouped_gemm_mma_kernel(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const Fp8GemmTile* tiles,
                                const int32_t* n_tiles, int N, int K, int scale_cols, int row_off, int col_block0,
                                float* y) {
  extern __shared__ __align__(16) uint8_t smem_fp8[];  // stages of activations [kBM], weight [kBN] rows
  if (n_tiles != nullptr && static_cast<int>(blockIdx.x) >= *n_tiles) return;  // a routed launch's surplus
  const Fp8GemmTile t = tiles[blockIdx.x];
  const int n0 = static_cast<int>(blockIdx.y) * kBN, steps = (K + kBK - 1) / kBK;
  const detail::GemmWarp w = detail::gemm_warp();
  const int g = w.g, wm = w.wm, wn = w.wn;

  float acc[2][4][4];
  detail::zero_gemm_acc(acc);

  // The pipeline of grouped_gemm_tile.cuh.
  for (int f = 0; f < detail::kGemmStages - 1; ++f) detail::fetch_gemm_stage(q, t, n0, N, K, f, steps, smem_fp8);
  for (int s = 0; s < steps; ++s) {
    const uint8_t* sa = detail::gemm_step_ready(smem_fp8, s);
    const uint8_t* sb = sa + kBM * detail::kGemmLd;
    detail::fetch_gemm_stage(q, t, n0, N, K, s + detail::kGemmStages - 1, steps, smem_fp8);

    // The block's code products, summed on the tensor cores across its 128 features.
    float part[2][4][4];
    detail::zero_gemm_acc(part);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32) {
      uint32_t fa[2][4], fb[4][2];
      detail::load_gemm_fragments(sa, sb, kk, w, fa, fb);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) detail::mma_e4m3_16832(part[mt][nt], fa[mt], fb[nt]);
    }

    // Promotion: the block's sums scaled by the row's and the weight block's scales, in fp32.
    // Rows past the tile and outputs past N take scale 0 (their codes were zeros).
    float rs[2][2], ws[4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 32 * wm + 16 * mt + g + 8 * h;
        rs[mt][h] = r < t.rows ? q_scales[s * q_scale_ld + t.row0 + r] : 0.0f;
      }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int n = n0 + 32 * wn + 8 * nt;  // its 8 outputs share a scale row (row_off % 8 == 0)
      ws[nt] = n < N ? t.scale_inv[((n + row_off) / kBK) * scale_cols + col_block0 + s] : 0.0f;
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] += part[mt][nt][e] * (rs[mt][e >> 1] * ws[nt]);
  }

  detail::store_gemm_acc(acc, t, n0, N, w, y);
}

void launch_gemm(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const Fp8GemmTile* tiles,
                 int64_t grid_tiles, const int32_t* n_tiles, const Fp8Weight& shape, float* y, cudaStream_t stream,
                 GemmCore core) {
  if (core == GemmCore::kWgmma) {
    detail::launch_fp8_grouped_gemm_wgmma(q, q_scales, q_scale_ld, tiles, grid_tiles, n_tiles, shape, y, stream);
    return;
  }
  const int64_t n_blocks = (shape.N + kBN - 1) / kBN;
  // Above the default 48 KB the kernel must opt in, once (a failure shows at launch).
  static const cudaError_t opted =
      cudaFuncSetAttribute(fp8_grouped_gemm_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(detail::kGemmSmemBytes));
  (void)opted;
  fp8_grouped_gemm_mma_kernel<<<dim3(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(n_blocks)), kThreads,
                                detail::kGemmSmemBytes, stream>>>(
      q, q_scales, q_scale_ld, tiles, n_tiles, static_cast<int>(shape.N), static_cast<int>(shape.K),
      static_cast<int>(shape.scale_cols), static_cast<int>(shape.row_off), static_cast<int>(shape.col_off / kBK), y);
}

}  // namespace

bool fp8_grouped_gemm_mma_fits(const Fp8Weight& shape) {
  // The kernel indexes within a weight and its scales in 32 bits.
  return shape.N <= INT32_MAX / 2 && shape.K <= INT32_MAX / 2 && shape.scale_cols <= INT32_MAX / 2 &&
         shape.row_off <= INT32_MAX / 2 && shape.col_off <= INT32_MAX / 2 && shape.block_rows == kBK &&
         shape.block_cols == kBK && shape.K > 0 && shape.N > 0 && shape.K % 16 == 0 && shape.col_off % kBK == 0 &&
         shape.row_off % 8 == 0 && shape.col_off >= 0 && shape.row_off >= 0;
}

void launch_fp8_grouped_gemm_mma(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const Fp8GemmTile* tiles,
                                 int64_t n_tiles, const Fp8Weight& shape, float* y, cudaStream_t stream,
                                 GemmCore core) {
  if (n_tiles <= 0) return;
  launch_gemm(q, q_scales, q_scale_ld, tiles, n_tiles, nullptr, shape, y, stream, core);
}

int64_t fp8_routed_gemm_max_tiles(int64_t max_rows, int64_t G) { return routed_gemm_max_tiles(max_rows, G, kBM); }

void launch_fp8_routed_gemm_mma(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, int64_t max_rows,
                                const int32_t* offsets, int64_t G, const RoutedWeight* weights, const Fp8Weight& shape,
                                Fp8GemmTile* tiles, int32_t* n_tiles, float* y, cudaStream_t stream, GemmCore core) {
  if (max_rows <= 0 || G <= 0) return;
  launch_routed_gemm_tiles(offsets, G, weights, kBM, tiles, n_tiles, stream);
  launch_gemm(q, q_scales, q_scale_ld, tiles, fp8_routed_gemm_max_tiles(max_rows, G), n_tiles, shape, y, stream, core);
}

}  // namespace shardlm::cuda
