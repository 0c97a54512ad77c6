// Multi-head Latent Attention in the absorbed form over a paged latent cache (the device form of
// cpu/latent_attention.h).
//
// Cache layout per layer: [num_blocks, block_size, kv_lora + rope_dim] of cache_fmt.elem (fp32,
// bf16, or fp8 with the one scale cache_fmt.k_scale for the whole row; stored and read back as
// kernels/kv_cache_format.h does), a row being a token's normed latent c followed by its roped
// shared key k_r; a slot is block * block_size + offset.
// Token t attends to positions [0, pos[t]] of its own sequence, whose logical block j is the
// physical block blocks[table_start[t] + j] (as in paged_attention.h). For head h:
//   s_j = (dot(q_latent[t,h], c_j) + dot(q_rope[t,h], r_j)) * scale
//   out[t,h] = sum_j softmax(s)_j c_j
// All pointers are device pointers. kv_lora <= 512, rope_dim <= 64.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_partitions.h"
#include "kv_cache_format.h"

namespace shardlm::cuda {

// latent: [T, kv_lora]; k_rope: [T, rope_dim]; slots: [T] (negative: padding, not stored).
// cache row slots[t] = [latent[t] | k_rope[t]].
void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                        int64_t rope_dim, void* cache, KvFormat cache_fmt, cudaStream_t stream);

// q_latent: [T, n_heads, kv_lora]; q_rope: [T, n_heads, rope_dim]; out: [T, n_heads, kv_lora].
// A token with pos[t] < 0 (padding) gets a zero output. `split` as in paged_attention.h (no
// sliding window here: window 0 for its partitions).
void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                      int64_t rope_dim, const void* cache, KvFormat cache_fmt, int64_t block_size,
                      const int32_t* blocks, const int32_t* table_start, const int32_t* pos, float scale, float* out,
                      const AttentionSplit& split, cudaStream_t stream);

// Thread blocks of an unsplit launch.
int64_t latent_attention_blocks(int64_t T, int64_t n_heads);

}  // namespace shardlm::cuda
