// Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2) in the absorbed form, over a paged cache
// of latents.
//
// Cache layout per layer: [num_blocks, block_size, kv_lora + rope_dim] of fmt.elem (fp32, bf16, or
// fp8 with the one scale fmt.k_scale for the whole row: kv_cache_format.h); a token's row holds
// its normed latent c (kv_lora values) followed by its roped shared key k_r (rope_dim values).
// A token's slot is block * block_size + offset, as in paged_attention.h. Every head of the layer
// reads the same rows (one latent "KV head"); the per-head key/value up-projections are applied
// outside: the query's no-rope half is absorbed into q_latent = W_UK_h^T q_nope_h beforehand and
// the output latent is mapped to the value space by W_UV_h afterwards.
//
// Token t attends causally to positions [0, pos[t]] of its own sequence, whose blocks are listed
// in block_table[t] (logical block j -> physical block). Each (token, head) result is computed in
// one fixed order that depends only on its own inputs and its sequence's cache (batch invariance).
#pragma once

#include <cstdint>

#include "cpu/cache_rows.h"

namespace shardlm::cpu {

// latent: [T, kv_lora]; k_rope: [T, rope_dim]; slots: [T] (negative: padding, not stored).
// cache row slots[t] = [latent[t] | k_rope[t]].
void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                        int64_t rope_dim, void* cache, KvFormat fmt);

// q_latent: [T, n_heads, kv_lora]; q_rope: [T, n_heads, rope_dim]; out: [T, n_heads, kv_lora].
// For token t, head h, positions j = 0..pos[t] with cache rows (c_j, r_j):
//   s_j = (dot(q_latent[t,h], c_j) + dot(q_rope[t,h], r_j)) * scale
//   p_j = exp(s_j - max s) / sum_j exp(s_j - max s)
//   out[t,h] = sum_j p_j c_j              (accumulated in increasing j)
// Dot products use the fixed 16-lane order of reduce_util.h; the softmax is its fp32
// softmax_in_place.
void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                      int64_t rope_dim, const void* cache, KvFormat fmt, int64_t block_size,
                      const int32_t* const* block_table, const int32_t* pos, float scale, float* out);

}  // namespace shardlm::cpu
