// One rotate-half RoPE pair, shared by rope.cu and rope_kv_write.cu so that both give the same
// bits. Each product is rounded on its own (no fused multiply-add), as the CPU's rope computes
// x1*cos - x2*sin and x2*cos + x1*sin.
#pragma once

#include <cuda_runtime.h>

namespace shardlm::cuda {

struct RopePair {
  float first, second;
};

// The pair (x1, x2) = (v[i], v[i + half]) rotated by the angle pos * inv_freq_i.
__device__ inline RopePair rope_pair(float x1, float x2, float pos, float inv_freq_i) {
  const float a = pos * inv_freq_i;
  const float c = cosf(a), s = sinf(a);
  return {__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)), __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s))};
}

}  // namespace shardlm::cuda
