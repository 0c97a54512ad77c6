// The block tile of the grouped GEMMs on Hopper's warpgroup products (wgmma.cuh), bf16
// (bf16_grouped_gemm_wgmma.cu) and e4m3 (fp8_grouped_gemm_wgmma.cu): the tile of
// grouped_gemm_tile.cuh (64 rows of one group against 128 outputs, 256 threads, 128 bytes of every
// row a step), so both cores take the same tile lists. Each of the two warpgroups computes the 64
// rows against 64 of the outputs, one m64n64 product per 32-byte k-slice, 4 a step.
//
// A stage holds a step's 64 activation rows then 128 weight rows in the 128-byte swizzle
// (wgmma.cuh), 1024-byte aligned: 24 KB. The pipeline keeps kWgmmaStages of them: the copies of the
// next two steps in flight while a step's products run, and the previous step's products still
// running on theirs (a warpgroup waits for its last group but one), so a stage is refilled two steps
// after its products were issued, once every warpgroup has waited for them and passed a barrier.
// 97 KB a block with the alignment slack: two blocks an SM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cp_async.cuh"
#include "cuda/gemm_tiles.h"
#include "cuda/grouped_gemm_tile.cuh"
#include "cuda/wgmma.cuh"

namespace shardlm::cuda::detail {

constexpr int kWgmmaStageBytes = (kGemmRows + kGemmCols) * kWgmmaRowBytes;
constexpr int kWgmmaStages = 4;
constexpr size_t kWgmmaSmemBytes = kWgmmaStages * static_cast<size_t>(kWgmmaStageBytes) + kWgmmaAtomBytes;
static_assert(kGemmStepBytes == kWgmmaRowBytes && kWgmmaStageBytes % kWgmmaAtomBytes == 0 && kGemmRows == 64,
              "a step is one swizzled row of every operand row, stages whole atoms, A one m64 operand");

// The stages in the 128-byte swizzle, for grouped_gemm_tile.cuh's fetch_gemm_stage<SwizzledStages>
// (the weight's rows follow the activations' 64, a multiple of 8: their swizzle starts afresh).
struct SwizzledStages {
  static constexpr int kStageBytes = kWgmmaStageBytes, kStages = kWgmmaStages;
  __device__ static int place(int r, int j) { return swizzled_chunk(r, j); }
};

// The pipeline, each thread of the block:
//   fetch steps 0 and 1
//   for each step s: st = wgmma_step_ready(s); issue s's products on st, commit; fetch step s + 2;
//                    wgmma_wait<1> (s - 1's products done)
// (the fetch after the products' issue, so the tensor cores start first).
// wgmma_step_ready returns step s's stage once it is the block's: this thread's copies of it landed
// (step s + 1's may be in flight), fenced for the products' reads, and past the barrier everyone's.
// The barrier also means every warpgroup has waited for step s - 2's products, whose stage the fetch
// of step s + 2 refills.
constexpr int kWgmmaFetchAhead = kWgmmaStages - 2;
__device__ inline const uint8_t* wgmma_step_ready(const uint8_t* stages, int s) {
  wait_async<kWgmmaFetchAhead - 1>();
  fence_shared_for_wgmma();
  __syncthreads();
  return stages + (s % kWgmmaStages) * kWgmmaStageBytes;
}

// Where a thread's accumulators sit: its warpgroup's outputs 64 h.., its warp's rows 16 q..
struct WgmmaWarp {
  int g, c, q, h;
};
__device__ inline WgmmaWarp wgmma_warp() {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  return {lane >> 2, lane & 3, warp & 3, warp >> 2};
}

// The descriptors of a stage's 32-byte k-slice at byte kk: the activations' rows, and the weight
// rows of the thread's warpgroup's 64 outputs.
__device__ inline uint64_t wgmma_a_desc(const uint8_t* stage, int kk) {
  return wgmma_desc(shared_window_address(stage) + static_cast<uint32_t>(kk));
}
__device__ inline uint64_t wgmma_b_desc(const uint8_t* stage, int kk, const WgmmaWarp& w) {
  return wgmma_desc(shared_window_address(stage) + static_cast<uint32_t>((kGemmRows + 64 * w.h) * kWgmmaRowBytes + kk));
}

// The thread's accumulators into y [., N] (fp32, row-major) for the tile's rows and outputs [n0, N).
__device__ inline void store_wgmma_acc(const float (&acc)[32], const GemmTile& t, int n0, int N, const WgmmaWarp& w,
                                       float* y) {
#pragma unroll
  for (int e2 = 0; e2 < 2; ++e2) {
    const int r = 16 * w.q + w.g + 8 * e2;
    if (r >= t.rows) continue;
    float* yr = y + (t.row0 + r) * N;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + 64 * w.h + 8 * j + 2 * w.c;
      if (n < N) yr[n] = acc[4 * j + 2 * e2];
      if (n + 1 < N) yr[n + 1] = acc[4 * j + 2 * e2 + 1];
    }
  }
}

}  // namespace shardlm::cuda::detail
