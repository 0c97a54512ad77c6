// The grouped bf16 GEMM of bf16_grouped_gemm_mma.h on Hopper's warpgroup products (wgmma.cuh,
// grouped_gemm_wgmma_tile.cuh): the same tiles, arithmetic (exact products, fp32 sums in the
// tensor cores' order) and outputs. Reached through bf16_grouped_gemm_mma.h's launchers with
// GemmCore::kWgmma; built for sm_90a (elsewhere its blocks compute nothing).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm_tiles.h"

namespace shardlm::cuda::detail {

// y for the listed tiles (n_tiles: null, or the routed launch's count in device memory).
void launch_bf16_grouped_gemm_wgmma(const uint16_t* x, const GemmTile* tiles, int64_t grid_tiles,
                                    const int32_t* n_tiles, int64_t N, int64_t K, float* y, cudaStream_t stream);

}  // namespace shardlm::cuda::detail
