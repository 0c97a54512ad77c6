// What an MLA layer's latent, rope key and queries' rope parts go through between their projection
// and the attention, in one launch: the latent's RMSNorm (kv_a_layernorm), RoPE of the rope key
// (in place) and of the queries' rope parts (into q_rope), and the step's cache rows
// [latent | rope key] stored. Each element comes out as rmsnorm, rope_strided and
// latent_cache_write give it one after another (the same bits), and latent and k_rope are left
// normed and rotated as those leave them. Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kv_cache_format.h"

namespace shardlm::cuda {

// The widest rope part it takes (DeepSeek-V3 and Kimi K2: 64): a token's rope key is staged in
// shared memory.
constexpr int64_t kLatentRopeMaxDim = 256;

struct LatentRope {
  const int32_t* pos;      // [T]
  const float* inv_freq;   // [rope_dim / 2]
  bool interleaved;        // pairs (2i, 2i+1), written de-interleaved (rope_strided's)
  float attention_factor;  // cos and sin multiplied by it
};

// latent [T, kv_lora] with its norm's weight norm_w [kv_lora] and eps; k_rope [T, rope_dim]; the
// queries' rope parts read at q + t*q_stride + h*q_head_stride (rope_dim wide) for n_heads heads,
// written packed to q_rope [T, n_heads, rope_dim]; slots [T], a negative slot stores nothing; the
// cache layout is latent_cache_write's.
void latent_rope_cache_write(float* latent, const float* norm_w, float eps, float* k_rope, const float* q,
                             int64_t n_heads, int64_t q_stride, int64_t q_head_stride, float* q_rope, int64_t T,
                             int64_t kv_lora, int64_t rope_dim, const LatentRope& rope, const int64_t* slots,
                             void* cache, KvFormat cache_fmt, cudaStream_t stream);

}  // namespace shardlm::cuda
