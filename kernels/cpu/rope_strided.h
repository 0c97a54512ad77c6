// Rotary position embedding over vectors read with strides and written packed, in either of Hugging
// Face's layouts, with a multiplier on cos and sin (YaRN's attention_factor). Used for the rope
// half of Multi-head Latent Attention's queries and shared key.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// For token t < T and head h < n_heads the input vector is v = x + t*x_stride + h*head_stride
// (rot_dim floats) and the output o = out + (t*n_heads + h)*rot_dim (out is [T, n_heads, rot_dim]).
// With half = rot_dim/2, angle a_i = float(pos[t]) * inv_freq[i] (fp32), c_i = cos(a_i) * attention_factor,
// s_i = sin(a_i) * attention_factor:
//   interleaved = false (rotate-half):  x1 = v[i],    x2 = v[i + half]
//   interleaved = true  (DeepSeek):     x1 = v[2i],   x2 = v[2i + 1]
//   o[i] = x1*c_i - x2*s_i,  o[i + half] = x2*c_i + x1*s_i          (i < half)
// The interleaved form is transformers' apply_rotary_pos_emb_interleave: pairs are rotated and
// the result is written de-interleaved. out may equal x when x is packed (x_stride ==
// n_heads*rot_dim, head_stride == rot_dim); other overlaps are not allowed.
void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                  int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                  float attention_factor, float* out);

}  // namespace shardlm::cpu
