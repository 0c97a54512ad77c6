// Rotary position embedding in Hugging Face's rotate-half layout: for head vector h of size
// head_dim, pairs (i, i + head_dim/2) are rotated by angle pos * inv_freq[i].
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// x: [T, n_heads, head_dim], rotated in place; pos: [T]; inv_freq: [head_dim / 2].
void rope_rotate_half(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                      const float* inv_freq);

}  // namespace shardlm::cpu
