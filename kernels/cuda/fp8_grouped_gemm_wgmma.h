// The grouped W8A8 GEMM of fp8_grouped_gemm_mma.h on Hopper's warpgroup products (wgmma.cuh,
// grouped_gemm_wgmma_tile.cuh): the fp8 tensor cores at their own rate, where mma.sync runs e4m3
// products on the f16 ones (mma_fp8.cuh). The same tiles, block scales, promotion per 128 features
// and outputs. Reached through fp8_grouped_gemm_mma.h's launchers with GemmCore::kWgmma; built for
// sm_90a (elsewhere its blocks compute nothing).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm_tiles.h"
#include "cuda/rows_matmul.h"

namespace shardlm::cuda::detail {

// y for the listed tiles (n_tiles: null, or the routed launch's count in device memory); shape as
// fp8_grouped_gemm_mma_fits takes it.
void launch_fp8_grouped_gemm_wgmma(const uint8_t* q, const float* q_scales, int64_t q_scale_ld, const GemmTile* tiles,
                                   int64_t grid_tiles, const int32_t* n_tiles, const Fp8Weight& shape, float* y,
                                   cudaStream_t stream);

}  // namespace shardlm::cuda::detail
