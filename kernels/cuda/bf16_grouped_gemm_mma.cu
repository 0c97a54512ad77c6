// See bf16_grouped_gemm_mma.h for the scheme; mma_bf16.cuh for the fragment layouts used below.
#include "cuda/bf16_grouped_gemm_mma.h"

#include <climits>
#include <cstdint>

#include "cuda/bf16_grouped_gemm_wgmma.h"
#include "cuda/grouped_gemm_tile.cuh"
#include "cuda/mma_bf16.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kThreads = detail::kGemmThreads;
constexpr int kBM = kBf16GemmTileRows, kBN = kBf16GemmTileCols;
constexpr int kBK = detail::kGemmStepBytes / 2;  // features a step
static_assert(kBM == detail::kGemmRows && kBN == detail::kGemmCols, "the tile of grouped_gemm_tile.cuh");

__global__ void __launch_bounds__(kThreads, 2)
    bf16_grouped_gemm_mma_kernel(const uint16_t* x, const GemmTile* tiles, const int32_t* n_tiles, int N, int K,
                                 float* y) {
  extern __shared__ __align__(16) uint8_t smem_bf16_gemm[];  // stages of activations [kBM], weight [kBN] rows
  if (n_tiles != nullptr && static_cast<int>(blockIdx.x) >= *n_tiles) return;  // a routed launch's surplus
  const GemmTile t = tiles[blockIdx.x];
  const int n0 = static_cast<int>(blockIdx.y) * kBN, steps = (K + kBK - 1) / kBK;
  const int row_bytes = 2 * K;  // K <= INT32_MAX / 2 (bf16_grouped_gemm_mma_fits)
  const auto* xb = reinterpret_cast<const uint8_t*>(x);
  const detail::GemmWarp w = detail::gemm_warp();

  float acc[2][4][4];
  detail::zero_gemm_acc(acc);

  // The pipeline of grouped_gemm_tile.cuh.
  for (int f = 0; f < detail::kGemmStages - 1; ++f)
    detail::fetch_gemm_stage(xb, t, n0, N, row_bytes, f, steps, smem_bf16_gemm);
  for (int s = 0; s < steps; ++s) {
    const uint8_t* sa = detail::gemm_step_ready(smem_bf16_gemm, s);
    const uint8_t* sb = sa + kBM * detail::kGemmLd;
    detail::fetch_gemm_stage(xb, t, n0, N, row_bytes, s + detail::kGemmStages - 1, steps, smem_bf16_gemm);
#pragma unroll
    for (int kk = 0; kk < detail::kGemmStepBytes; kk += 32) {  // 16 features a product
      uint32_t fa[2][4], fb[4][2];
      detail::load_gemm_fragments(sa, sb, kk, w, fa, fb);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) detail::mma_bf16_16816(acc[mt][nt], fa[mt], fb[nt]);
    }
  }
  detail::store_gemm_acc(acc, t, n0, N, w, y);
}

void launch_gemm(const uint16_t* x, const GemmTile* tiles, int64_t grid_tiles, const int32_t* n_tiles, int64_t N,
                 int64_t K, float* y, cudaStream_t stream, GemmCore core) {
  if (core == GemmCore::kWgmma) {
    detail::launch_bf16_grouped_gemm_wgmma(x, tiles, grid_tiles, n_tiles, N, K, y, stream);
    return;
  }
  const int64_t n_blocks = (N + kBN - 1) / kBN;
  // Above the default 48 KB the kernel must opt in, once (a failure shows at launch).
  static const cudaError_t opted =
      cudaFuncSetAttribute(bf16_grouped_gemm_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(detail::kGemmSmemBytes));
  (void)opted;
  bf16_grouped_gemm_mma_kernel<<<dim3(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(n_blocks)), kThreads,
                                 detail::kGemmSmemBytes, stream>>>(x, tiles, n_tiles, static_cast<int>(N),
                                                                   static_cast<int>(K), y);
}

}  // namespace

bool bf16_grouped_gemm_mma_fits(int64_t N, int64_t K) {
  return N > 0 && K > 0 && K % 8 == 0 && N <= INT32_MAX / 2 && K <= INT32_MAX / 2;
}

void launch_bf16_grouped_gemm_mma(const uint16_t* x, const GemmTile* tiles, int64_t n_tiles, int64_t N, int64_t K,
                                  float* y, cudaStream_t stream, GemmCore core) {
  if (n_tiles <= 0) return;
  launch_gemm(x, tiles, n_tiles, nullptr, N, K, y, stream, core);
}

int64_t bf16_routed_gemm_max_tiles(int64_t max_rows, int64_t G) { return routed_gemm_max_tiles(max_rows, G, kBM); }

void launch_bf16_routed_gemm_mma(const uint16_t* x, int64_t max_rows, const int32_t* offsets, int64_t G,
                                 const RoutedWeight* weights, int64_t N, int64_t K, GemmTile* tiles, int32_t* n_tiles,
                                 float* y, cudaStream_t stream, GemmCore core) {
  if (max_rows <= 0 || G <= 0) return;
  launch_routed_gemm_tiles(offsets, G, weights, kBM, tiles, n_tiles, stream);
  launch_gemm(x, tiles, bf16_routed_gemm_max_tiles(max_rows, G), n_tiles, N, K, y, stream, core);
}

}  // namespace shardlm::cuda
