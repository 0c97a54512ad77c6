// Elementwise adds and the fp32 <-> bf16 casts. Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);
// y[m, n] += bias[n] for y [M, N] row-major.
void add_bias_rows(float* y, int64_t M, int64_t N, const float* bias, cudaStream_t stream);
// Round to nearest even, a NaN stays a (quiet) NaN: bit for bit shardlm::f32_to_bf16 of
// src/core/dtype.h.
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// Exact widening.
void bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);

}  // namespace shardlm::cuda
