// One RoPE pair, shared by rope.cu and the kernels that fuse rope with the cache write
// (rope_kv_write.cu, latent_rope_cache_write.cu) so that they give the same bits. Each product
// is rounded on its own (no fused multiply-add), as the CPU's rope computes x1*cos - x2*sin and
// x2*cos + x1*sin.
#pragma once

#include <cuda_runtime.h>

namespace shardlm::cuda {

struct RopePair {
  float first, second;
};

__device__ inline RopePair rotate(float x1, float x2, float c, float s) {
  return {__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)), __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s))};
}

// The pair (x1, x2) = (v[i], v[i + half]) rotated by the angle pos * inv_freq_i.
__device__ inline RopePair rope_pair(float x1, float x2, float pos, float inv_freq_i) {
  const float a = pos * inv_freq_i;
  return rotate(x1, x2, cosf(a), sinf(a));
}

// The same with cos and sin multiplied by attention_factor (YaRN's mscale; rope_strided).
__device__ inline RopePair rope_pair_scaled(float x1, float x2, float pos, float inv_freq_i, float attention_factor) {
  const float a = pos * inv_freq_i;
  return rotate(x1, x2, __fmul_rn(cosf(a), attention_factor), __fmul_rn(sinf(a), attention_factor));
}

}  // namespace shardlm::cuda
