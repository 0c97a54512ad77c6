// y[M,N] = x[M,K] · W[N,K]^T (+ bias[N]), fp32 activations, fp32 or bf16 weights (row-major [N,K],
// the layout of a Hugging Face Linear weight).
//
// Batch invariance: every y element is reduced over K in one fixed order that depends only on K,
// never on M, N, the tile a row lands in or the thread count, so a request's logits are bit-equal
// whether it runs alone or inside a batch.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

void matmul_f32w(const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias, float* y);
// w holds bf16 bit patterns.
void matmul_bf16w(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, const float* bias,
                  float* y);

}  // namespace shardlm::cpu
