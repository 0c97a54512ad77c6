// One m16n8k16 tensor core product through mma_bf16.cuh, fragments loaded from and stored to
// plain row-major matrices by the layout that header states: what the kernel tests check against
// a host product, on the GPU (the instruction itself) and over the emulation (its stand-in), so a
// wrong layout shows up there rather than only as a wrong attention output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// d[16][8] = c[16][8] + a[16][16] * b[16][8]: a and b bf16 bits, row major; device pointers; one warp.
void mma_bf16_tile(const uint16_t* a, const uint16_t* b, const float* c, float* d, cudaStream_t stream);

}  // namespace shardlm::cuda
