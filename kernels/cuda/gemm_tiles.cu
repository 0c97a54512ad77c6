#include "cuda/gemm_tiles.h"

namespace shardlm::cuda {
namespace {

// One thread: a few hundred groups at most (a rank's local experts).
__global__ void routed_gemm_tiles_kernel(const int32_t* offsets, int64_t G, const RoutedWeight* weights, int tile_rows,
                                         GemmTile* tiles, int32_t* n_tiles) {
  int32_t n = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int32_t r0 = offsets[g], r1 = offsets[g + 1];
    for (int32_t m0 = r0; m0 < r1; m0 += tile_rows)
      tiles[n++] = GemmTile{weights[g].weight, weights[g].scale_inv, m0, r1 - m0 < tile_rows ? r1 - m0 : tile_rows, 0};
  }
  *n_tiles = n;
}

}  // namespace

void launch_routed_gemm_tiles(const int32_t* offsets, int64_t G, const RoutedWeight* weights, int tile_rows,
                              GemmTile* tiles, int32_t* n_tiles, cudaStream_t stream) {
  routed_gemm_tiles_kernel<<<1, 1, 0, stream>>>(offsets, G, weights, tile_rows, tiles, n_tiles);
}

}  // namespace shardlm::cuda
