// The block tile both grouped tensor-core GEMMs share (fp8_grouped_gemm_mma.cu: e4m3, m16n8k32;
// bf16_grouped_gemm_mma.cu: bf16, m16n8k16): 256 threads compute 64 rows of one group
// (gemm_tiles.h) against 128 outputs, 8 warps of 32 x 32 (2 along the rows x 4 along the outputs).
// A step stages 128 bytes of every row of both operands (128 e4m3 or 64 bf16 features) into one of
// kGemmStages shared-memory stages by cp.async, the copies of the next kGemmStages - 1 steps in
// flight while a step's products run. With two stages a step's loads had one step's products to
// land in (256 m16n8k16 products a block: at the tensor cores' full rate, one a clock an SM, about
// 512 clocks for an SM's two blocks); three stages, as CUTLASS's sm80 GEMMs use at least, give them
// two. Rows are padded to 144 bytes (36 words: the 8 rows a fragment load touches start 4 banks
// apart, so its 32 words fall in 32 banks; 16-byte copies stay aligned). In bytes the two element
// types' fragments sit alike: a 32-byte k-step's A fragment holds a row's words at 4c and 4c + 16
// for rows g and g + 8, the B fragment an output's at 4c and 4c + 16 (g = lane / 4, c = lane % 4):
// four 8-row x 16-byte matrices of one ldmatrix.x4 each (ldmatrix.cuh), for an A tile and for a
// pair of B tiles, so a k-step's fragments take a warp 4 instructions rather than 16 32-bit loads
// (the same 128-byte phases, conflict-free by the pitch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cp_async.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/ldmatrix.cuh"

namespace shardlm::cuda::detail {

constexpr int kGemmThreads = 256;
constexpr int kGemmRows = 64, kGemmCols = 128;
constexpr int kGemmStepBytes = 128;           // of every row, a step
constexpr int kGemmLd = kGemmStepBytes + 16;  // a staged row's stride, bytes
constexpr int kGemmStageBytes = (kGemmRows + kGemmCols) * kGemmLd;
constexpr int kGemmStages = 3;
// 81 KB: two blocks an SM (the kernels' launch bounds) fit its 227 KB.
constexpr size_t kGemmSmemBytes = kGemmStages * static_cast<size_t>(kGemmStageBytes);

// Where a thread's warp sits in the tile: its rows 32 wm.., outputs 32 wn..; g, c as above. la,
// lb: the byte offsets (from the warp's first row, at the k-step) of the rows this lane names to
// ldmatrix: for A, matrix m = lane / 8 is rows 8 (m % 2).. at byte 16 (m / 2); for a B pair,
// outputs 8 (m / 2).. at byte 16 (m % 2).
struct GemmWarp {
  int g, c, wm, wn, la, lb;
};
__device__ inline GemmWarp gemm_warp() {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int r = lane & 7, m = lane >> 3;
  return {lane >> 2,
          lane & 3,
          warp >> 2,
          warp & 3,
          (r + 8 * (m & 1)) * kGemmLd + 16 * (m >> 1),
          (r + 8 * (m >> 1)) * kGemmLd + 16 * (m & 1)};
}

// A warp's accumulator tiles: [row tile][output tile][fragment element].
__device__ inline void zero_gemm_acc(float (&x)[2][4][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[mt][nt][e] = 0.0f;
}

// How a kernel's stages lie in shared memory: bytes a stage, stages, and where chunk j (16 bytes)
// of a stage's row r (the activations' 64, then the weight's 128) goes. These kernels': rows padded
// to kGemmLd bytes (grouped_gemm_wgmma_tile.cuh has the swizzled ones).
struct PaddedStages {
  static constexpr int kStageBytes = kGemmStageBytes, kStages = kGemmStages;
  __device__ static int place(int r, int j) { return r * kGemmLd + 16 * j; }
};

// Step bytes [k0, k0 + 128) of the tile's rows of a (rows of row_bytes from t.row0) and of outputs
// [n0, n0 + 128) of the tile's weight (rows of row_bytes) into a stage, zeros past the tile's rows,
// past N and past row_bytes: chunk i of a thread is row (tid + 256 i) / 8, bytes 16 ((tid + 256 i)
// % 8) of the step; the activations' 64 rows, then the weight's 128.
// (row_bytes and k0 below 2^31: the kernels' terms.)
template <class Stages>
__device__ inline void fetch_gemm_step(const uint8_t* a, const GemmTile& t, int n0, int N, int row_bytes, int k0,
                                       uint8_t* stage) {
  constexpr int kChunksA = kGemmRows * kGemmStepBytes / 16 / kGemmThreads;
  constexpr int kChunksB = kGemmCols * kGemmStepBytes / 16 / kGemmThreads;
#pragma unroll
  for (int i = 0; i < kChunksA; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kGemmThreads * i, r = idx >> 3, k = k0 + 16 * (idx & 7);
    const bool full = r < t.rows && k < row_bytes;
    copy16_async(stage + Stages::place(r, idx & 7), full ? a + (t.row0 + r) * row_bytes + k : a, full);
  }
  const auto* w = static_cast<const uint8_t*>(t.weight);
#pragma unroll
  for (int i = 0; i < kChunksB; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kGemmThreads * i, n = n0 + (idx >> 3), k = k0 + 16 * (idx & 7);
    const bool full = n < N && k < row_bytes;
    copy16_async(stage + Stages::place(kGemmRows + (idx >> 3), idx & 7),
                 full ? w + static_cast<int64_t>(n) * row_bytes + k : w, full);
  }
  commit_async();
}

// Step `step` of steps into its stage (smem: the stages), one group of copies; past the last step an
// empty group, so that every step's wait counts the same groups (gemm_step_ready).
template <class Stages = PaddedStages>
__device__ inline void fetch_gemm_stage(const uint8_t* a, const GemmTile& t, int n0, int N, int row_bytes, int step,
                                        int steps, uint8_t* smem) {
  if (step < steps)
    fetch_gemm_step<Stages>(a, t, n0, N, row_bytes, step * kGemmStepBytes,
                            smem + (step % Stages::kStages) * Stages::kStageBytes);
  else
    commit_async();
}

// The pipeline a kernel runs, each of its threads (smem: the stages):
//   for step in [0, kGemmStages - 1): fetch_gemm_stage(step)
//   for each step s: sa = gemm_step_ready(s); fetch_gemm_stage(s + kGemmStages - 1); products on sa
// gemm_step_ready returns step s's stage once it is the block's: this thread's copies of it have
// landed (the kGemmStages - 2 newer groups may be in flight) and, past the barrier, everyone's;
// the barrier also means every warp is done with step s - 1, whose stage the fetch then refills.
__device__ inline const uint8_t* gemm_step_ready(const uint8_t* smem, int s) {
  wait_async<kGemmStages - 2>();
  __syncthreads();
  return smem + (s % kGemmStages) * kGemmStageBytes;
}

// The warp's A fragments (its two 16-row tiles) and B fragments (its four 8-output tiles) of the
// 32-byte k-step at byte kk of a staged step (sa: the activations' rows, sb: the weight's).
__device__ inline void load_gemm_fragments(const uint8_t* sa, const uint8_t* sb, int kk, const GemmWarp& w,
                                           uint32_t (&fa)[2][4], uint32_t (&fb)[4][2]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(fa[mt], sa + (32 * w.wm + 16 * mt) * kGemmLd + kk + w.la);
#pragma unroll
  for (int np = 0; np < 2; ++np) {
    uint32_t r[4];
    ldmatrix_x4(r, sb + (32 * w.wn + 16 * np) * kGemmLd + kk + w.lb);
    fb[2 * np][0] = r[0], fb[2 * np][1] = r[1], fb[2 * np + 1][0] = r[2], fb[2 * np + 1][1] = r[3];
  }
}

// The warp's accumulators into y [., N] (fp32, row-major) for the tile's rows and outputs [n0, N).
__device__ inline void store_gemm_acc(const float (&acc)[2][4][4], const GemmTile& t, int n0, int N, const GemmWarp& w,
                                      float* y) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 32 * w.wm + 16 * mt + w.g + 8 * h;
      if (r >= t.rows) continue;
      float* yr = y + (t.row0 + r) * N;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int n = n0 + 32 * w.wn + 8 * nt + 2 * w.c;
        if (n < N) yr[n] = acc[mt][nt][2 * h];
        if (n + 1 < N) yr[n + 1] = acc[mt][nt][2 * h + 1];
      }
    }
}

}  // namespace shardlm::cuda::detail
