// One m16n8k32 e4m3 tensor core product through mma_fp8.cuh, fragments loaded from and stored to
// plain matrices by the layout that header states: what the kernel tests check against a host
// product, on the GPU (the instruction itself) and over the emulation (its stand-in), so a wrong
// layout shows up there rather than only as a wrong grouped GEMM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// d[16][8] = c[16][8] + a[16][32] * b[32][8]: a e4m3 codes row major, b e4m3 codes column major
// (b[n * 32 + k], as a weight [N][K] is stored); device pointers; one warp.
void mma_fp8_tile(const uint8_t* a, const uint8_t* b, const float* c, float* d, cudaStream_t stream);

}  // namespace shardlm::cuda
