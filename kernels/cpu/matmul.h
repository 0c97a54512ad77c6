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

// G matmuls on consecutive row ranges in one parallel region (Mixture-of-Experts: every expert's
// projection at once): rows [offsets[g], offsets[g+1]) of x [offsets[G], K] times w[g] ([N, K],
// no bias) into the same rows of y [offsets[G], N]; rows outside the groups are not written. The
// work is split over (group, column range) items, so many small groups cost one fork/join
// instead of one each. Each element is bit-identical to matmul_*w on its group alone.
void grouped_matmul_f32w(const float* x, const int64_t* offsets, int64_t G, int64_t K, const float* const* w,
                         int64_t N, float* y);
void grouped_matmul_bf16w(const float* x, const int64_t* offsets, int64_t G, int64_t K, const uint16_t* const* w,
                          int64_t N, float* y);

// One input through several matmuls in one parallel region (a layer's q/k/v projections, or
// gate and up): y_i[M, N_i] = x[M,K] · w_i[N_i,K]^T (+ bias_i) for each part. The threads split
// the parts' column tiles together, so three projections cost one fork/join instead of three.
// Each element is bit-identical to matmul_*w on its part alone.
template <typename WT>
struct MatmulPart {
  const WT* w = nullptr;
  int64_t N = 0;
  const float* bias = nullptr;
  float* y = nullptr;
};
void matmul_parts_f32w(const float* x, int64_t M, int64_t K, const MatmulPart<float>* parts, int64_t n_parts);
void matmul_parts_bf16w(const float* x, int64_t M, int64_t K, const MatmulPart<uint16_t>* parts, int64_t n_parts);

}  // namespace shardlm::cpu
