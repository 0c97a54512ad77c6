// Paged GQA attention for prefill chunks on tensor cores (flash-attention 2's scheme on
// mma.sync bf16): paged_attention.h's op, with the scores and the weighted sums as bf16 x bf16
// products accumulated in fp32.
//
// Why: the fp32 kernels (paged_attention, paged_attention_tiled) run on the CUDA cores, at most
// the fp32 peak (67 TFLOP/s on an H200), while a prefill chunk's attention is a pair of GEMMs
// ([tokens x head_dim] x [head_dim x positions], then [tokens x positions] x [positions x
// head_dim]) that tensor cores run at up to 989 TFLOP/s in bf16. At a few thousand positions the
// attention of a prompt costs as much as its linear layers, so this is where long prompts go.
//
// A thread block takes a tile of up to kPrefillMmaRows rows of one sequence: 4 warps of 16 rows.
// A prefill chunk's tile is up to 64 of its tokens for one query head; a short run (a chunk's last
// few tokens, a short prompt, a lone token) packs the query heads of one KV head instead, row
// r being token r / heads, head r % heads, so that their keys and values are staged once for the
// group rather than once per query head. Rounds of 64 positions (32 at head_dim > 128), aligned
// to multiples of the round from position 0, are staged in shared memory as bf16 (K and V row
// major, each fragment one ldmatrix, V's transposed); each warp computes its 16 x 64 scores with
// mma.sync m16n8k16, masks them to each token's own [first, pos] (causal, sliding window), folds
// them into a per-row online softmax (fp32, base 2), rounds the weights to bf16 and multiplies
// them with V the same way, the weights never leaving registers. A warp skips the rounds none of
// its tokens attends to (the causal upper triangle).
//
// Numerics (what --prefill-attention bf16 trades): the query, the keys and values of an fp32
// cache, and the softmax weights are rounded to bf16 (a bf16 cache's values are exact, and an fp8
// cache's codes are exact in bf16, its scales applied to the scores and the outputs in fp32); the
// normaliser sums the rounded weights, so each output is a convex combination of the staged values.
// Against the fp32 kernels the outputs differ by about 2^-9 relative, as in every bf16 flash
// attention (vLLM, TensorRT-LLM, SGLang).
//
// Each token's output depends only on its own query, its position and its sequence's cache (the
// rounds are aligned to absolute positions, and a round none of a row's positions falls in leaves
// its state exactly as it was), so how the steps split a prompt into chunks and tiles does not
// change it. A token with pos < 0 (padding) gets a zero output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kv_cache_format.h"

namespace shardlm::cuda {

// Tokens per tile (a thread block).
constexpr int kPrefillMmaRows = 64;

// The tiles of a step from the host copy of its table starts, for two launches: runs of
// consecutive tokens with the same table start (one sequence's chunk) cut every kPrefillMmaRows
// tokens, each piece of at most kPrefillMmaRows / packed_heads tokens packing packed_heads query
// heads (the largest divisor of the group, n_heads / n_kv_heads, up to kPrefillMmaRows; 1 for
// MHA, when every piece is a one-head tile), the others one head a tile. tiles holds (first token,
// tokens) pairs: the one_head tiles, then the packed ones; every token of [0, T) is in exactly one,
// or without `singles` every token of a run of two or more (run_positions.h's in_run).
struct PrefillMmaTiles {
  std::vector<int32_t> tiles;
  int64_t one_head = 0, packed = 0;
  int packed_heads = 1;
};
PrefillMmaTiles prefill_attention_mma_tiles(const int32_t* table_start, int64_t T, int64_t group, bool singles);

// As paged_attention (paged_attention.h) unsplit, for the tokens of n_tiles tiles (on the device:
// tiles, (first token, tokens) pairs, tokens x heads_per_tile <= kPrefillMmaRows) and all query
// heads, heads_per_tile of them a tile (a divisor of n_heads / n_kv_heads); head_dim <= 256.
// twin (null: none): out's bf16 twin, written with it.
void prefill_attention_mma(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const void* k_cache,
                           const void* v_cache, KvFormat cache_fmt, int64_t block_size, const int32_t* blocks,
                           const int32_t* table_start, const int32_t* pos, int64_t window, float scale,
                           const int32_t* tiles, int64_t n_tiles, int heads_per_tile, float* out, uint16_t* twin,
                           cudaStream_t stream);

}  // namespace shardlm::cuda
