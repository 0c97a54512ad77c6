// Per-head matrix products, the absorbed projections of Multi-head Latent Attention: every head
// has its own [N, K] weight, applied to that head's K-wide slice of the input.
//
// w is [n_heads * N, K] row-major (head h's weight is rows [h*N, (h+1)*N), a Linear weight
// [out, in]); x is read with strides; y is [T, n_heads, N]:
//   y[(t*n_heads + h)*N + n] = sum_k x[t*x_stride + h*head_stride + k] * w[(h*N + n)*K + k]
// Each element is reduced exactly as matmul.h reduces it (one fixed order depending only on K),
// so results do not depend on T, on the other tokens of the batch or on the thread count.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

void head_matmul_f32w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                      int64_t K, const float* w, int64_t N, float* y);
// w holds bf16 bit patterns.
void head_matmul_bf16w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                       int64_t K, const uint16_t* w, int64_t N, float* y);

}  // namespace shardlm::cpu
