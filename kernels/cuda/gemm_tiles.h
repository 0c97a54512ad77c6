// The tile lists of the grouped tensor-core GEMMs (fp8_grouped_gemm_mma.h, bf16_grouped_gemm_mma.h):
// a block per tile of up to `tile rows` consecutive rows of one group against a column range of its
// weight. The host lists them for a grouped call; for a routed call (a Mixture-of-Experts step in a
// CUDA graph) a one-thread kernel lists them from the groups' offsets in device memory, in the
// host's order, and the GEMM's grid covers the most tiles the rows can take, its surplus blocks
// returning at once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/rows_matmul.h"

namespace shardlm::cuda {

// The tensor-core products a grouped GEMM runs on: mma.sync (sm_80 on; on Hopper at a share of the
// tensor cores' rate, and e4m3 at the f16 rate) or Hopper's warpgroup wgmma (sm_90a builds only).
enum class GemmCore { kMmaSync, kWgmma };

// Rows [row0, row0 + rows) of the activations and the output times one group's weight (and, fp8,
// its block scales).
struct GemmTile {
  const void* weight;
  const float* scale_inv;
  int64_t row0;
  int32_t rows;
  int32_t unused;
};

// Tiles a list must hold for max_rows rows in G groups, tile_rows at a time: every full tile takes
// tile_rows rows and each group adds at most one partial tile.
inline int64_t routed_gemm_max_tiles(int64_t max_rows, int64_t G, int64_t tile_rows) {
  return max_rows / tile_rows + G;
}

// tiles[0, *n_tiles) for g < G: group g's rows [offsets[g], offsets[g + 1]) from its first,
// tile_rows at a time, weights[g] (RoutedWeight of rows_matmul.h) their weight.
void launch_routed_gemm_tiles(const int32_t* offsets, int64_t G, const RoutedWeight* weights, int tile_rows,
                              GemmTile* tiles, int32_t* n_tiles, cudaStream_t stream);

}  // namespace shardlm::cuda
