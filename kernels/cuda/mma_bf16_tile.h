// One m16n8k16 tensor core product through mma_bf16.cuh, fragments loaded from and stored to
// plain row-major matrices by the layout that header states: what the kernel tests check against
// a host product, on the GPU (the instruction itself) and over the emulation (its stand-in), so a
// wrong layout shows up there rather than only as a wrong attention output. Likewise for the
// fragment loads of ldmatrix.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// d[16][8] = c[16][8] + a[16][16] * b[16][8]: a and b bf16 bits, row major; device pointers; one warp.
void mma_bf16_tile(const uint16_t* a, const uint16_t* b, const float* c, float* d, cudaStream_t stream);

// d[16][16] = c[16][16] + a[16][16] * b[16][16] as two m16n8k16 products whose fragments come from
// shared memory by ldmatrix: a's by ldmatrix_x4, b's (row major, [k][n]) by ldmatrix_x4_trans;
// rows staged `pitch` elements apart (a multiple of 8, at least 16). One warp.
void mma_bf16_tile_ldmatrix(const uint16_t* a, const uint16_t* b, const float* c, float* d, int pitch,
                            cudaStream_t stream);

}  // namespace shardlm::cuda
