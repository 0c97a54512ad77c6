// The online softmax of the tensor-core attention kernels (prefill_attention_mma.cu,
// prefill_latent_attention_mma.cu), on a warp's scores held in mma accumulator tiles
// (mma_bf16.cuh): s[nt] covers the warp's 16 rows at positions [base + 8 nt, base + 8 nt + 8);
// this lane holds rows g = lane / 4 and g + 8, columns 2c and 2c + 1 (c = lane % 4) of each tile,
// and the other three lanes of its quad the rest of those rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/mma_bf16.cuh"

namespace shardlm::cuda::detail {

// Folds a round of raw scores into the rows' running max m (base 2) and sum l, and rescales the
// output accumulators o (the first `live` tiles; the rest are unused): position p of row i counts
// when lo[i] <= p <= hi[i], its score times score_scale (log2 e folded in). s leaves as the rows'
// weights rounded to bf16 (0 where not counted), which l sums, so that the normaliser is the sum of
// the weights the value product uses. A row with no position yet keeps m = -inf and l = 0; a round
// with none of a row's positions leaves its m, l and o exactly as they were.
template <int NT, int OT>
__device__ inline void mma_softmax_round(float (&s)[NT][4], int base, const int (&lo)[2], const int (&hi)[2],
                                         float score_scale, float (&m)[2], float (&l)[2], float (&o)[OT][4]) {
  const int c = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = base + nt * 8 + 2 * c + e;
        float& x = s[nt][2 * i + e];
        x = p >= lo[i] && p <= hi[i] ? x * score_scale : -INFINITY;
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m[i], mx);
    // No position of the row yet (mn = -inf): nothing to rescale. Else exp2(-inf) = 0 on the row's
    // first positions, and exactly 1 on a round with none of them (mx = -inf).
    const float corr = mn == -INFINITY ? 1.0f : exp2f(m[i] - mn);
    // A tile's two weights of the row rounded to bf16 by one conversion (the rounding pack_bf16x2
    // makes again, exactly, for the value product), then summed in the same order as ever. With
    // the integer rounding, twice, a 64-position round of a lane's two rows and its value
    // fragments took 1344 sm_90a instructions in a probe kernel that loads and stores them; 952
    // now, 189 of them the loads and stores.
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float& x0 = s[nt][2 * i];
      float& x1 = s[nt][2 * i + 1];
      const uint32_t w = pack_bf16x2(x0 == -INFINITY ? 0.0f : exp2f(x0 - mn), x1 == -INFINITY ? 0.0f : exp2f(x1 - mn));
      x0 = __uint_as_float(w << 16);
      x1 = __uint_as_float(w & 0xffff0000u);
      sum += x0;
      sum += x1;
    }
    l[i] = l[i] * corr + sum;
    m[i] = mn;
#pragma unroll
    for (int k = 0; k < OT; ++k) {
      o[k][2 * i] *= corr;
      o[k][2 * i + 1] *= corr;
    }
  }
}

// The weights of positions [base + 16 kk, base + 16 kk + 16) as the A fragment of the value
// product: tiles 2 kk and 2 kk + 1 packed (mma_bf16.cuh).
template <int NT>
__device__ inline void mma_weights_fragment(const float (&s)[NT][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// A row's sum over its quad, then the factor its outputs take: out_scale / sum, 0 for a row that
// attended to nothing (padding).
__device__ inline float mma_output_factor(float l, float out_scale) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  return l > 0.0f ? out_scale / l : 0.0f;
}

}  // namespace shardlm::cuda::detail
