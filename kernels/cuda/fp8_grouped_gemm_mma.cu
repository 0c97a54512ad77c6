// See fp8_grouped_gemm_mma.h for the scheme; mma_fp8.cuh for the fragment layouts used below.
#include "cuda/fp8_grouped_gemm_mma.h"

#include <climits>
#include <cstdint>
#include <cstring>

#include "cuda/cp_async.cuh"
#include "cuda/mma_fp8.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps: 2 along the rows x 4 along the outputs, 32 x 32 each
constexpr int kBM = kFp8GemmTileRows, kBN = kFp8GemmTileCols;
constexpr int kBK = 128;  // features a step: one scale block
// Staged rows are padded by 16 bytes (row stride 144 = 36 words), so the 8 rows a fragment load
// touches start 4 banks apart and its 32 words fall in 32 banks; 16-byte stores stay aligned.
constexpr int kLd = kBK + 16;
constexpr int kChunksA = kBM * kBK / 16 / kThreads;  // 16-byte chunks a thread stages a step
constexpr int kChunksB = kBN * kBK / 16 / kThreads;
static_assert(kBM == 64 && kBN == 128, "the warp grid below is 2 x 4 warps of 32 x 32");

// Two stages: the next step's operands are copied into one while the current step's products read
// the other.
constexpr int kStageBytes = (kBM + kBN) * kLd;
constexpr size_t kSmemBytes = 2 * static_cast<size_t>(kStageBytes);

// A warp's accumulator tiles: [row tile][output tile][fragment element].
__device__ inline void zero(float (&x)[2][4][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[mt][nt][e] = 0.0f;
}

// A step's operands into a stage (zeros past the tile's rows, past N and past K): chunk i of a
// thread is row (tid + 256 i) / 8, bytes 16 ((tid + 256 i) % 8) of the step; activations [kBM]
// rows, then the weight's [kBN].
__device__ inline void fetch_step(const uint8_t* q, const Fp8GemmTile& t, int n0, int N, int K, int k0,
                                  uint8_t* stage) {
#pragma unroll
  for (int i = 0; i < kChunksA; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kThreads * i, r = idx >> 3, k = k0 + 16 * (idx & 7);
    const bool full = r < t.rows && k < K;
    detail::copy16_async(stage + r * kLd + 16 * (idx & 7), full ? q + (t.row0 + r) * K + k : q, full);
  }
  uint8_t* sb = stage + kBM * kLd;
#pragma unroll
  for (int i = 0; i < kChunksB; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kThreads * i, n = n0 + (idx >> 3), k = k0 + 16 * (idx & 7);
    const bool full = n < N && k < K;
    const auto* codes = static_cast<const uint8_t*>(t.weight);
    detail::copy16_async(sb + (idx >> 3) * kLd + 16 * (idx & 7), full ? codes + static_cast<int64_t>(n) * K + k : codes,
                         full);
  }
  detail::commit_async();
}

__global__ void __launch_bounds__(kThreads, 2)
    fp8_grouped_gemm_mma_kernel(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const Fp8GemmTile* tiles,
                                const int32_t* n_tiles, int N, int K, int scale_cols, int row_off, int col_block0,
                                float* y) {
  extern __shared__ __align__(16) uint8_t smem_fp8[];  // two stages of activations [kBM][kLd], weight [kBN][kLd]
  if (n_tiles != nullptr && static_cast<int>(blockIdx.x) >= *n_tiles) return;  // a routed launch's surplus
  const Fp8GemmTile t = tiles[blockIdx.x];
  const int n0 = static_cast<int>(blockIdx.y) * kBN, steps = (K + kBK - 1) / kBK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;  // the warp's rows 32 wm.., outputs 32 wn.. of the tile

  float acc[2][4][4];
  zero(acc);

  fetch_step(q, t, n0, N, K, 0, smem_fp8);
  for (int s = 0; s < steps; ++s) {
    const uint8_t* sa = smem_fp8 + (s & 1) * kStageBytes;
    const uint8_t* sb = sa + kBM * kLd;
    detail::wait_async();
    // Step s is staged by every thread, and every warp is done with step s - 1, whose stage the
    // next copies overwrite.
    __syncthreads();
    if (s + 1 < steps) fetch_step(q, t, n0, N, K, (s + 1) * kBK, smem_fp8 + ((s + 1) & 1) * kStageBytes);

    // The block's code products, summed on the tensor cores across its 128 features.
    float part[2][4][4];
    zero(part);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32) {
      uint32_t fa[2][4], fb[4][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint8_t* p = sa + (32 * wm + 16 * mt + g) * kLd + kk + 4 * c;
        fa[mt][0] = detail::ld_shared32(p);
        fa[mt][1] = detail::ld_shared32(p + 8 * kLd);
        fa[mt][2] = detail::ld_shared32(p + 16);
        fa[mt][3] = detail::ld_shared32(p + 8 * kLd + 16);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint8_t* p = sb + (32 * wn + 8 * nt + g) * kLd + kk + 4 * c;
        fb[nt][0] = detail::ld_shared32(p);
        fb[nt][1] = detail::ld_shared32(p + 16);
      }
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

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 32 * wm + 16 * mt + g + 8 * h;
      if (r >= t.rows) continue;
      float* yr = y + (t.row0 + r) * N;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int n = n0 + 32 * wn + 8 * nt + 2 * c;
        if (n < N) yr[n] = acc[mt][nt][2 * h];
        if (n + 1 < N) yr[n + 1] = acc[mt][nt][2 * h + 1];
      }
    }
}

void launch_gemm(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const Fp8GemmTile* tiles,
                 int64_t grid_tiles, const int32_t* n_tiles, const Fp8Weight& shape, float* y, cudaStream_t stream) {
  const int64_t n_blocks = (shape.N + kBN - 1) / kBN;
  // Above the default 48 KB the kernel must opt in, once (a failure shows at launch).
  static const cudaError_t opted = cudaFuncSetAttribute(
      fp8_grouped_gemm_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
  (void)opted;
  fp8_grouped_gemm_mma_kernel<<<dim3(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(n_blocks)), kThreads,
                                kSmemBytes, stream>>>(
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
                                 int64_t n_tiles, const Fp8Weight& shape, float* y, cudaStream_t stream) {
  if (n_tiles <= 0) return;
  launch_gemm(q, q_scales, q_scale_ld, tiles, n_tiles, nullptr, shape, y, stream);
}

int64_t fp8_routed_gemm_max_tiles(int64_t max_rows, int64_t G) { return routed_gemm_max_tiles(max_rows, G, kBM); }

void launch_fp8_routed_gemm_mma(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, int64_t max_rows,
                                const int32_t* offsets, int64_t G, const RoutedWeight* weights, const Fp8Weight& shape,
                                Fp8GemmTile* tiles, int32_t* n_tiles, float* y, cudaStream_t stream) {
  if (max_rows <= 0 || G <= 0) return;
  launch_routed_gemm_tiles(offsets, G, weights, kBM, tiles, n_tiles, stream);
  launch_gemm(q, q_scales, q_scale_ld, tiles, fp8_routed_gemm_max_tiles(max_rows, G), n_tiles, shape, y, stream);
}

}  // namespace shardlm::cuda
