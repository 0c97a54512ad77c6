// Grouped bf16 GEMM on bf16 tensor cores with fp32 output: every local expert's projection over
// its own rows in one launch, for Mixture-of-Experts steps captured in a CUDA graph, whose
// per-expert row ranges stay in device memory (a routed call). There the direct kernel
// (rows_matmul.h) reads each bf16 weight once per 8 rows: on an H200 a DeepSeek-V3-sized layer
// (32 experts of 7168 x 2048) at 1024 tokens took 43.5 ms that way, against 3.5 ms for cuBLAS's
// grouped GEMM outside a graph. This kernel reads a weight once per 64 rows.
//
//   y[r, n] = sum_k x[r, k] * w(n, k)     (x and w bf16, products exact in fp32, sums in fp32)
//
// Tiling as the grouped W8A8 kernel's (fp8_grouped_gemm_mma.h): a block computes
// kBf16GemmTileRows rows of one group against kBf16GemmTileCols outputs, 8 warps of 32 x 32
// (mma.sync m16n8k16, mma_bf16.cuh), 64 features of both operands a step in shared memory, the
// next step's copies issued before the current step's products. A row's result does not depend on
// the rows sharing its tile or launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm_tiles.h"
#include "cuda/rows_matmul.h"

namespace shardlm::cuda {

constexpr int kBf16GemmTileRows = 64;
constexpr int kBf16GemmTileCols = 128;

// Whether the kernel takes an [N, K] weight: K a multiple of 8 (16-byte rows), sizes within its
// 32-bit indexing. The weights, x and their rows must be 16-byte aligned too.
bool bf16_grouped_gemm_mma_fits(int64_t N, int64_t K);

// y [., N] (fp32, row-major) for the tiles' rows of x [., K] (bf16 bits); tiles (device memory)
// lists n_tiles tiles (gemm_tiles.h: weight = the group's bf16 [N, K], scale_inv unused). core:
// the products it runs on (the wgmma kernel: bf16_grouped_gemm_wgmma.h), the same tiles and results
// up to the fp32 sums' order.
void launch_bf16_grouped_gemm_mma(const uint16_t* x, const GemmTile* tiles, int64_t n_tiles, int64_t N, int64_t K,
                                  float* y, cudaStream_t stream, GemmCore core = GemmCore::kMmaSync);

// Tiles the routed call's list must hold (the launch's grid).
int64_t bf16_routed_gemm_max_tiles(int64_t max_rows, int64_t G);

// For g < G: rows [offsets[g], offsets[g + 1]) of y [max_rows, N] from the same rows of x times
// weights[g] (bf16 [N, K]); rows from offsets[G] (<= max_rows) on are not written. tiles
// (bf16_routed_gemm_max_tiles entries) and n_tiles (one int) are device workspace.
void launch_bf16_routed_gemm_mma(const uint16_t* x, int64_t max_rows, const int32_t* offsets, int64_t G,
                                 const RoutedWeight* weights, int64_t N, int64_t K, GemmTile* tiles, int32_t* n_tiles,
                                 float* y, cudaStream_t stream, GemmCore core = GemmCore::kMmaSync);

}  // namespace shardlm::cuda
