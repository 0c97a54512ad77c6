// Multi-head Latent Attention for decode tokens on tensor cores: latent_attention.h's op (the
// absorbed form over the paged latent cache) with prefill_latent_attention_mma.h's numerics: the
// query, an fp32 cache's latent rows and the softmax weights rounded to bf16, an fp8 cache's codes
// exact with its row scale applied in fp32, products accumulated in fp32.
//
// Why: a decode token's heads all read the same latent rows, and each scores a position over
// kv_lora + rope dims (576 for DeepSeek-V3 and Kimi K2) and sums kv_lora (512) of its values:
// about 2.2 kFLOP per head and position. A tensor-parallel shard of 16 heads thus does 35 kFLOP
// per 1152-byte bf16 row, 30 FLOP a byte, where the H200 has 14 fp32 FLOP (67 TFLOP/s) per byte
// of HBM (4.8 TB/s): on the CUDA cores (latent_attention.h, a warp a head) MLA decode is bound by
// its arithmetic even for one sequence, and more so for 128 heads on one GPU. The bf16 tensor
// cores give 206 FLOP a byte, so the same work can run at the speed of the rows it reads. This is
// how DeepSeek-V3 decode runs in vLLM and SGLang (FlashMLA: bf16 queries and latent cache, fp32
// accumulation).
//
// Layout of a launch: a block takes 16 heads of one token (kRows rows: a DeepSeek-V3 shard of 16
// heads is one block a token) and one position partition of attention_partitions.h in a split
// launch, every partition of the token in an unsplit one. A partition is folded from empty in
// rounds of 32 positions (latent_mma_round.cuh); its state (m, l and the weighted sums, with the
// fp8 row scale applied) is merged with the operations attention_combine merges with, so a split
// launch (attention_combine after it) and an unsplit one give the same bits, and a token's output
// depends only on its own query, position and cache, whatever else the step holds or whether it
// runs from a captured graph (the grid depends only on the step's size and the split).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_partitions.h"
#include "kv_cache_format.h"

namespace shardlm::cuda {

// Query rows a block takes (heads of one token).
constexpr int64_t kDecodeLatentMmaHeads = 16;

// As latent_attention (latent_attention.h), for any tokens (prefill chunks' too, each on its own):
// q_latent [T, n_heads, kv_lora], q_rope [T, n_heads, rope_dim], out [T, n_heads, kv_lora]; a
// token with pos[t] < 0 gets zeros. kv_lora <= 512, rope_dim <= 64. `split` as in
// paged_attention.h: parts > 1 writes [T, n_heads, parts, kv_lora + 2] states and merges them.
void decode_latent_attention_mma(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads,
                                 int64_t kv_lora, int64_t rope_dim, const void* cache, KvFormat cache_fmt,
                                 int64_t block_size, const int32_t* blocks, const int32_t* table_start,
                                 const int32_t* pos, float scale, float* out, const AttentionSplit& split,
                                 cudaStream_t stream);

// Thread blocks of an unsplit launch.
int64_t decode_latent_attention_mma_blocks(int64_t T, int64_t n_heads);

}  // namespace shardlm::cuda
