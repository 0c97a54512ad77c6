// What a GQA layer's queries, keys and values go through between their projection and attention,
// in one launch: Qwen3's per-head RMSNorm of q and k (where their weights are given), rotate-half
// RoPE of both, and the step's keys and values stored in the paged KV cache. Each element comes out
// as rmsnorm, rope_rotate_half_qk and kv_cache_write give it one after another (the same bits),
// and q and k are left normed and rotated in place as those leave them. Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kv_cache_format.h"

namespace shardlm::cuda {

// The widest head it takes: a block stages 8 heads in its 48 KiB of static shared memory.
constexpr int64_t kRopeKvWriteMaxHeadDim = 1024;

// q: [T, q_heads, head_dim]; k, v: [T, kv_heads, head_dim]; q_norm, k_norm: [head_dim] or null
// (no norm); pos: [T]; inv_freq: [head_dim / 2]; slots: [T], a negative slot (padding token) stores
// nothing. The cache layout is kv_cache_write's.
void rope_kv_write(float* q, int64_t q_heads, float* k, const float* v, int64_t kv_heads, int64_t T, int64_t head_dim,
                   const float* q_norm, const float* k_norm, float eps, const int32_t* pos, const float* inv_freq,
                   const int64_t* slots, void* k_cache, void* v_cache, KvFormat cache_fmt, cudaStream_t stream);

}  // namespace shardlm::cuda
