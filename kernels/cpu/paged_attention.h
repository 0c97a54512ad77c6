// Causal attention over a paged KV cache (grouped-query).
//
// Cache layout per layer: k_cache, v_cache [num_blocks, n_kv_heads, block_size, head_dim] of
// fmt.elem (fp32, bf16, or fp8 read back times fmt.k_scale / fmt.v_scale: kv_cache_format.h), a KV
// head's rows of a block together. A work item reads one KV head, whose rows of a 16-position block
// are then one 4 KiB run (head_dim 64, fp32) instead of 16 runs of 256 bytes a whole row apart: two
// threads streaming such runs read 22.7 GB/s against 15.9 (EPYC, 35 GB/s peak), and long decode
// attention runs 15-20% faster. A token's cache slot is block * block_size + offset. Prefill chunks
// and decode tokens go through the same path: token t attends to positions
// [max(0, pos[t] - window + 1), pos[t]] of its own sequence, whose blocks are listed in
// block_table[t] (logical block j -> physical block). Each token's result depends only on its own
// q and its sequence's cache (batch invariance).
#pragma once

#include <cstdint>

#include "cpu/cache_rows.h"

namespace shardlm::cpu {

// k, v: [T, n_kv_heads, head_dim]; slots: [T] (negative: padding, not stored).
void kv_cache_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                    int64_t head_dim, int64_t block_size, void* k_cache, void* v_cache, KvFormat fmt);

// q, out: [T, n_heads, head_dim]; block_table[t] points at the block list of token t's sequence;
// window <= 0 means full causal attention.
void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const void* k_cache, const void* v_cache, KvFormat fmt, int64_t block_size,
                     const int32_t* const* block_table, const int32_t* pos, int64_t window, float scale, float* out);

}  // namespace shardlm::cpu
