// Per-head matrix products, the absorbed projections of Multi-head Latent Attention (the device form
// of cpu/head_matmul.h): every head has its own [N, K] weight, applied to that head's K-wide slice
// of the input.
//
// w is [n_heads * N, K] row-major (head h's weight is rows [h*N, (h+1)*N)); x is read with
// strides; y is [T, n_heads, N]:
//   y[(t*n_heads + h)*N + n] = sum_k x[t*x_stride + h*head_stride + k] * w[(h*N + n)*K + k]
// Every element is reduced over k in increasing order by one thread, so it does not depend on T or
// on the other tokens of the batch. All pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// twin: null, or y's bf16 twin [T, n_heads, N]: each element's bf16_bits::from_f32 beside it.
void head_matmul_f32w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K,
                      const float* w, int64_t N, float* y, uint16_t* twin, cudaStream_t stream);
// w holds bf16 bit patterns.
void head_matmul_bf16w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K,
                       const uint16_t* w, int64_t N, float* y, uint16_t* twin, cudaStream_t stream);

}  // namespace shardlm::cuda
