// See bf16_grouped_gemm_mma.h for the scheme; mma_bf16.cuh for the fragment layouts used below.
#include "cuda/bf16_grouped_gemm_mma.h"

#include <climits>
#include <cstdint>

#include "cuda/cp_async.cuh"
#include "cuda/mma_bf16.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps: 2 along the rows x 4 along the outputs, 32 x 32 each
constexpr int kBM = kBf16GemmTileRows, kBN = kBf16GemmTileCols;
constexpr int kBK = 64;  // features a step: 128 bytes of a row
// Staged rows are padded by 8 elements (row stride 144 bytes = 36 words), so the 8 rows a fragment
// load touches start 4 banks apart and its 32 words fall in 32 banks; 16-byte copies stay aligned.
constexpr int kLd = kBK + 8;
constexpr int kChunksA = kBM * kBK / 8 / kThreads;  // 16-byte chunks a thread copies a step
constexpr int kChunksB = kBN * kBK / 8 / kThreads;
static_assert(kBM == 64 && kBN == 128, "the warp grid below is 2 x 4 warps of 32 x 32");

// Two stages: the next step's operands are copied into one while the current step's products read
// the other.
constexpr int kStageElems = (kBM + kBN) * kLd;
constexpr size_t kSmemBytes = 2 * sizeof(uint16_t) * static_cast<size_t>(kStageElems);

// A step's operands into a stage (zeros past the tile's rows, past N and past K): chunk i of a
// thread is row (tid + 256 i) / 8, elements 8 ((tid + 256 i) % 8) of the step; activations [kBM]
// rows, then the weight's [kBN].
__device__ inline void fetch_step(const uint16_t* x, const GemmTile& t, int n0, int N, int K, int k0, uint16_t* stage) {
#pragma unroll
  for (int i = 0; i < kChunksA; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kThreads * i, r = idx >> 3, k = k0 + 8 * (idx & 7);
    const bool full = r < t.rows && k < K;
    detail::copy16_async(stage + r * kLd + 8 * (idx & 7), full ? x + (t.row0 + r) * K + k : x, full);
  }
  uint16_t* sb = stage + kBM * kLd;
  const auto* w = static_cast<const uint16_t*>(t.weight);
#pragma unroll
  for (int i = 0; i < kChunksB; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kThreads * i, n = n0 + (idx >> 3), k = k0 + 8 * (idx & 7);
    const bool full = n < N && k < K;
    detail::copy16_async(sb + (idx >> 3) * kLd + 8 * (idx & 7), full ? w + static_cast<int64_t>(n) * K + k : w, full);
  }
  detail::commit_async();
}

__global__ void __launch_bounds__(kThreads, 2)
    bf16_grouped_gemm_mma_kernel(const uint16_t* x, const GemmTile* tiles, const int32_t* n_tiles, int N, int K,
                                 float* y) {
  extern __shared__ __align__(16) uint16_t smem_bf16_gemm[];  // two stages: activations [kBM][kLd], weight [kBN][kLd]
  if (n_tiles != nullptr && static_cast<int>(blockIdx.x) >= *n_tiles) return;  // a routed launch's surplus
  const GemmTile t = tiles[blockIdx.x];
  const int n0 = static_cast<int>(blockIdx.y) * kBN, steps = (K + kBK - 1) / kBK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;  // the warp's rows 32 wm.., outputs 32 wn.. of the tile

  float acc[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  fetch_step(x, t, n0, N, K, 0, smem_bf16_gemm);
  for (int s = 0; s < steps; ++s) {
    const uint16_t* sa = smem_bf16_gemm + (s & 1) * kStageElems;
    const uint16_t* sb = sa + kBM * kLd;
    detail::wait_async();
    // Step s is staged by every thread, and every warp is done with step s - 1, whose stage the
    // next copies overwrite.
    __syncthreads();
    if (s + 1 < steps) fetch_step(x, t, n0, N, K, (s + 1) * kBK, smem_bf16_gemm + ((s + 1) & 1) * kStageElems);

#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t fa[2][4], fb[4][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint16_t* p = sa + (32 * wm + 16 * mt + g) * kLd + kk + 2 * c;
        fa[mt][0] = detail::ld_shared32(p);
        fa[mt][1] = detail::ld_shared32(p + 8 * kLd);
        fa[mt][2] = detail::ld_shared32(p + 8);
        fa[mt][3] = detail::ld_shared32(p + 8 * kLd + 8);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint16_t* p = sb + (32 * wn + 8 * nt + g) * kLd + kk + 2 * c;
        fb[nt][0] = detail::ld_shared32(p);
        fb[nt][1] = detail::ld_shared32(p + 8);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) detail::mma_bf16_16816(acc[mt][nt], fa[mt], fb[nt]);
    }
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

void launch_gemm(const uint16_t* x, const GemmTile* tiles, int64_t grid_tiles, const int32_t* n_tiles, int64_t N,
                 int64_t K, float* y, cudaStream_t stream) {
  const int64_t n_blocks = (N + kBN - 1) / kBN;
  // Above the default 48 KB the kernel must opt in, once (a failure shows at launch).
  static const cudaError_t opted = cudaFuncSetAttribute(
      bf16_grouped_gemm_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
  (void)opted;
  bf16_grouped_gemm_mma_kernel<<<dim3(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(n_blocks)), kThreads,
                                 kSmemBytes, stream>>>(x, tiles, n_tiles, static_cast<int>(N), static_cast<int>(K), y);
}

}  // namespace

bool bf16_grouped_gemm_mma_fits(int64_t N, int64_t K) {
  return N > 0 && K > 0 && K % 8 == 0 && N <= INT32_MAX / 2 && K <= INT32_MAX / 2;
}

void launch_bf16_grouped_gemm_mma(const uint16_t* x, const GemmTile* tiles, int64_t n_tiles, int64_t N, int64_t K,
                                  float* y, cudaStream_t stream) {
  if (n_tiles <= 0) return;
  launch_gemm(x, tiles, n_tiles, nullptr, N, K, y, stream);
}

int64_t bf16_routed_gemm_max_tiles(int64_t max_rows, int64_t G) { return routed_gemm_max_tiles(max_rows, G, kBM); }

void launch_bf16_routed_gemm_mma(const uint16_t* x, int64_t max_rows, const int32_t* offsets, int64_t G,
                                 const RoutedWeight* weights, int64_t N, int64_t K, GemmTile* tiles, int32_t* n_tiles,
                                 float* y, cudaStream_t stream) {
  if (max_rows <= 0 || G <= 0) return;
  launch_routed_gemm_tiles(offsets, G, weights, kBM, tiles, n_tiles, stream);
  launch_gemm(x, tiles, bf16_routed_gemm_max_tiles(max_rows, G), n_tiles, N, K, y, stream);
}

}  // namespace shardlm::cuda
