// Paged GQA attention for prefill chunks: paged_attention.h's op, with a thread block serving up
// to kPrefillTileTokens consecutive tokens of one sequence instead of one token.
//
// The per-token kernel stages a token's whole prefix from device memory (L2 at best) once per
// token, so a chunk of T tokens reads its prefix T times. Here the tokens of a tile share each
// staged round: a round of 16 cache rows is read once and every warp (one query head) scores and
// folds it for each of the tile's tokens in turn, so the chunk's prefix is read T / tile times.
// Each (token, head) goes through exactly the per-token kernel's operations, rounds and partition
// merges, so the output is the same bits as paged_attention's unsplit launch (tested on a GPU).
//
// Tokens [b * tile, (b + 1) * tile) go to block b's tile; the block takes them in runs of
// consecutive tokens with the same block table start, and a token with a sliding window or a
// padding position runs alone, so any step is correct. The gain is for prefill chunks, whose
// tokens are consecutive and share their table: the backend picks this launch for steps made of
// them (CudaBackend::attention), the per-token one for decode steps and split launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kv_cache_format.h"

namespace shardlm::cuda {

// Tokens per tile: 4 for head_dim <= 128, 2 above (the registers of a warp's tokens).
int paged_attention_tile_tokens(int64_t head_dim);

// As paged_attention (paged_attention.h) unsplit; head_dim <= 256. twin (null: none): out's bf16
// twin, written with it.
void paged_attention_tiled(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                           const void* k_cache, const void* v_cache, KvFormat cache_fmt, int64_t block_size,
                           const int32_t* blocks, const int32_t* table_start, const int32_t* pos, int64_t window,
                           float scale, float* out, uint16_t* twin, cudaStream_t stream);

}  // namespace shardlm::cuda
