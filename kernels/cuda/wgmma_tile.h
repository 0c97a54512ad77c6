// One warpgroup product through wgmma.cuh over operands staged in its 128-byte swizzle, stored back
// by the accumulator layout that header states: what the kernel tests check against a host product,
// on an sm_90 GPU (the instruction, its descriptors and the swizzle) and over the emulation (its
// stand-in), so a wrong assumption about the layouts shows up there, apart from the grouped GEMMs'
// pipelines.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// d[64][64] = a[64][128 bytes] b[64][128 bytes]^T over the 32-byte k-slice at byte kk (0, 32, 64
// or 96) of every row: 16 bf16 features (fp8 false) or 32 e4m3 codes (true). a and b row major,
// b as a weight [N][K] is stored; device pointers; one warpgroup.
void wgmma_tile(const uint8_t* a, const uint8_t* b, int kk, bool fp8, float* d, cudaStream_t stream);

}  // namespace shardlm::cuda
