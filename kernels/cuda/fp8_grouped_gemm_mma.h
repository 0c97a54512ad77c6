// Grouped W8A8 GEMM on fp8 tensor cores: every local expert's projection over its own rows in one
// launch (Mixture-of-Experts prefill on DeepSeek-V3 / Kimi K2 checkpoints, whose experts are e4m3
// with 128 x 128 block scales), where cuBLASLt's block-scaled GEMM takes one launch per expert.
//
//   y[r, n] = sum over 128-feature blocks b of
//             (sum_{k in b} q[r, k] * code(n, k)) * (q_scale(r, b) * w_scale(n, b))
//
// q: the activations quantised per row and 128 features (kernels/cuda/fp8_act_quant.h: codes
// [R, K], scales [ceil(K / 128)][q_scale_ld]); each block's code products are summed on the
// tensor cores (mma_fp8.cuh; on Hopper as exact f16 products in fp32) and promoted to fp32 with
// the two scales once per block, as DeepSeek-V3's recipe and cuBLASLt's VEC128 x BLK128x128
// scaling do. A row's result does not depend on the rows sharing its tile or launch.
//
// Tiling: a block computes kFp8GemmTileRows rows of one group against kFp8GemmTileCols outputs
// (grid: tiles x ceil(N / kFp8GemmTileCols)), 8 warps of 32 x 32, staging 128 features of both
// operands per step in shared memory (grouped_gemm_tile.cuh); the next step's global loads are
// issued before the current step's products.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm_tiles.h"
#include "cuda/rows_matmul.h"

namespace shardlm::cuda {

constexpr int kFp8GemmTileRows = 64;
constexpr int kFp8GemmTileCols = 128;

// One tile of a grouped call (gemm_tiles.h): rows [row0, row0 + rows) of q and y (rows <=
// kFp8GemmTileRows) times one group's weight (its e4m3 codes [N, K] and block scales).
using Fp8GemmTile = GemmTile;

// Whether the kernel takes weights of this shape and scale geometry (`shape`'s codes and
// scale_inv unused): 128 x 128 blocks, K a multiple of 16, col_off on the block grid, row_off a
// multiple of 8 (an 8-output fragment never straddles two scale rows). Every tile's codes, q and
// their row length must be 16-byte aligned too (K a multiple of 16 and 16-byte aligned bases).
bool fp8_grouped_gemm_mma_fits(const Fp8Weight& shape);

// y [., N] (fp32, row-major) for the tiles' rows; tiles (device memory) lists n_tiles tiles, all of
// `shape`'s N, K and scale geometry.
// core: the products it runs on (the wgmma kernel: fp8_grouped_gemm_wgmma.h).
void launch_fp8_grouped_gemm_mma(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const Fp8GemmTile* tiles,
                                 int64_t n_tiles, const Fp8Weight& shape, float* y, cudaStream_t stream,
                                 GemmCore core = GemmCore::kMmaSync);

// ---- Device-routed grouped call (Mixture-of-Experts steps captured in a CUDA graph) ----
//
// The groups' row ranges in device memory (an expert permutation's offsets): a one-block kernel
// turns them into tiles (as the host builds them: each group's rows from its first, 64 at a
// time), and the GEMM's grid covers the most tiles max_rows rows in G groups can take, its surplus
// blocks returning at once. A row gets the bits the host-listed launch gives it.

// Tiles the list must hold for max_rows rows in G groups (the launch's grid).
int64_t fp8_routed_gemm_max_tiles(int64_t max_rows, int64_t G);

// For g < G: rows [offsets[g], offsets[g + 1]) of y [max_rows, N] from the same rows of q (codes
// and scales as above, q_scale_ld >= max_rows) times group g's weight (weights[g]: codes and
// scales, RoutedWeight of rows_matmul.h); rows from offsets[G] (<= max_rows) on are not written.
// tiles (fp8_routed_gemm_max_tiles entries) and n_tiles (one int) are device workspace.
void launch_fp8_routed_gemm_mma(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, int64_t max_rows,
                                const int32_t* offsets, int64_t G, const RoutedWeight* weights, const Fp8Weight& shape,
                                Fp8GemmTile* tiles, int32_t* n_tiles, float* y, cudaStream_t stream,
                                GemmCore core = GemmCore::kMmaSync);

}  // namespace shardlm::cuda
