// Causal grouped-query attention over a paged KV cache (the device form of cpu::paged_attention).
//
// Cache layout per layer: k_cache, v_cache [num_blocks, block_size, n_kv_heads, head_dim] of
// cache_fmt.elem: fp32, bf16, or fp8 with cache_fmt's scales (read back exactly as
// kernels/kv_cache_format.h reads them); a slot is block * block_size + offset. Token t attends to positions
// [max(0, pos[t] - window + 1), pos[t]] (window <= 0: [0, pos[t]]) of its own sequence; that
// sequence's logical block j is the physical block blocks[table_start[t] + j]. Query head h reads
// KV head h / (n_heads / n_kv_heads). Decode tokens and prefill chunks go through the same call,
// and each (token, head) result depends only on its own query and its sequence's cache.
//
// All pointers are device pointers. head_dim <= 256. A token with pos[t] < 0 (padding) gets a
// zero output. `split` (attention_partitions.h) spreads each token's position partitions over
// blocks of their own; the output is the same bits either way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_partitions.h"
#include "kv_cache_format.h"

namespace shardlm::cuda {

// q, out: [T, n_heads, head_dim]; blocks: the block lists of all sequences, concatenated;
// table_start, pos: [T]. twin: null, or out's bf16 twin [T, n_heads, head_dim]: every output
// element's bf16_bits::from_f32 is written there too (the o_proj GEMM reads it without a cast).
void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const void* k_cache, const void* v_cache, KvFormat cache_fmt, int64_t block_size,
                     const int32_t* blocks, const int32_t* table_start, const int32_t* pos, int64_t window, float scale,
                     float* out, uint16_t* twin, const AttentionSplit& split, cudaStream_t stream);

// Thread blocks of an unsplit launch (attention_split_parts weighs it against the device).
int64_t paged_attention_blocks(int64_t T, int64_t n_heads, int64_t n_kv_heads);

}  // namespace shardlm::cuda
