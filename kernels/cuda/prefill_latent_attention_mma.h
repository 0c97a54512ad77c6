// Multi-head Latent Attention for prefill chunks on tensor cores: latent_attention.h's op (the
// absorbed form over the paged latent cache), with the scores and the weighted sums as bf16 x bf16
// mma.sync products accumulated in fp32, as prefill_attention_mma.h does for GQA.
//
// Why: in the absorbed form every (token, head) scores each cached position over kv_lora + rope
// dims (576 for DeepSeek-V3 and Kimi K2) and sums kv_lora (512) of its values, about 2.2 kFLOP
// per position and head. A 4096-token DeepSeek-V3 prompt then costs about 2.3 TFLOP of attention
// per layer over its 128 heads, half the FLOPs of its linear layers (about 5 TFLOP per layer for
// 37B active parameters), but on the fp32 CUDA cores (67 TFLOP/s on an H200) where the linears run
// W8A8 on fp8 tensor cores (1979): attention would take most of a long prompt's prefill time.
//
// Every head reads the same latent rows (one shared "KV head"), so a thread block takes 16 rows
// of (token, head) pairs of one sequence, 4 warps. Rounds of 32 positions are staged in shared
// memory as bf16 once: the whole row is the key, its latent part the value, whose fragments a
// transposing ldmatrix reads from the same rows. Each warp
// scores the 16 rows against 8 of the round's positions over all kv_lora + rope dims (one n-tile)
// and writes them to shared memory; then every warp reads the 16 x 32 scores, folds them into the
// rows' online softmax (fp32, base 2; the four warps keep identical copies) and multiplies the
// bf16 weights with its quarter of the kv_lora value dims.
//
// Numerics as prefill_attention_mma.h: queries, an fp32 cache's latent rows and the softmax
// weights rounded to bf16; an fp8 cache's codes exact, its one row scale applied in fp32 to the
// scores and the outputs. A (token, head)'s output depends only on its own query, position and
// its sequence's cache. A token with pos < 0 (padding) gets a zero output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kv_cache_format.h"

namespace shardlm::cuda {

// The tiles of a step: for each run of consecutive tokens with the same table start (one
// sequence's chunk), its (token, head) pairs in token-major order, 16 at a time. Returns (first
// token of the run, tokens in the run, first pair of the tile) triples, flattened. Without
// `singles`, runs of one token are left out (run_positions.h).
std::vector<int32_t> prefill_latent_attention_mma_tiles(const int32_t* table_start, int64_t T, int64_t n_heads,
                                                        bool singles);

// As latent_attention (latent_attention.h) unsplit, over the tiles made by
// prefill_latent_attention_mma_tiles (on the device: n_tiles triples); kv_lora <= 512,
// rope_dim <= 64.
void prefill_latent_attention_mma(const float* q_latent, const float* q_rope, int64_t n_heads, int64_t kv_lora,
                                  int64_t rope_dim, const void* cache, KvFormat cache_fmt, int64_t block_size,
                                  const int32_t* blocks, const int32_t* table_start, const int32_t* pos, float scale,
                                  const int32_t* tiles, int64_t n_tiles, float* out, cudaStream_t stream);

}  // namespace shardlm::cuda
