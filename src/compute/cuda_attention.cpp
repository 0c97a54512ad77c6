// CudaBackend::attention and latent_attention: the paged kernels of kernels/cuda, launched split
// along the positions when the step would leave the device short of work, eager or captured (see
// kernels/cuda/attention_partitions.h), and for steps of prefill chunks as the kernel that shares
// each staged round across a tile of a sequence's tokens (paged_attention_tiled.h). The output is
// the same bits every way, so the choice is free to weigh the device alone. With
// set_prefill_attention_bf16, an eager step's prefill chunks (its runs of two or more tokens of a
// sequence) run on tensor cores instead (prefill_attention_mma.h, prefill_latent_attention_mma.h:
// bf16 operands, fp32 accumulation; other bits than the fp32 kernels), and its single tokens
// (decode) on the fp32 kernels, in one launch over the step with the runs masked
// (run_positions.h): a decode token gets the same bits beside chunks as in a decode step. With
// set_decode_attention_bf16 as well, MLA's decode tokens run on tensor cores too
// (decode_latent_attention_mma.h), eager or captured, the same bits either way.
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/attention_partitions.h"
#include "cuda/decode_latent_attention_mma.h"
#include "cuda/latent_attention.h"
#include "cuda/paged_attention.h"
#include "cuda/paged_attention_tiled.h"
#include "cuda/prefill_attention_mma.h"
#include "cuda/prefill_latent_attention_mma.h"
#include "cuda/run_positions.h"

namespace shardlm {

namespace {

// Whether a step is mostly prefill chunks: at least half its tokens follow a token of the same
// sequence (the same table start), so the tiled prefill kernel shares their staged rows. Known
// only from the host copy of the table starts (an eager step's).
bool mostly_chunks(const BlockTables& tables, int64_t T) {
  if (tables.host_start == nullptr || T < 2) return false;
  int64_t follow = 0;
  for (int64_t t = 1; t < T; ++t) follow += tables.host_start[t] == tables.host_start[t - 1];
  return 2 * follow >= T;
}

}  // namespace

// The most device memory a split launch's partition states may take. A step over this (many
// heads, very long contexts) runs unsplit: same result, less parallelism.
constexpr int64_t kMaxSplitStateBytes = int64_t{256} << 20;

cuda::AttentionSplit CudaBackend::attention_split(int64_t blocks, int64_t T, int64_t n_heads, int64_t width,
                                                  const BlockTables& tables, int64_t window) {
  // The most partitions any token can have, from the bound on the positions: the step's largest,
  // or for a step captured for replay the context limit (the grid is baked into the graph). Blocks
  // past a token's last partition return at once.
  const int64_t max_parts = cuda::attention_max_partitions(tables.max_pos, window);
  const int64_t floats = cuda::attention_split_floats(T, n_heads, width, max_parts);
  const int64_t parts =
      cuda::attention_split_parts(blocks, sms_, max_parts, floats * int64_t{sizeof(float)}, kMaxSplitStateBytes);
  if (parts <= 1) return {};
  if (static_cast<size_t>(floats) > attn_states_n_) {
    // Nothing may allocate inside a capture: run unsplit, the same bits. (A captured step's eager
    // warm-up run, with the same tables, has sized the buffer already.)
    if (capturing_) return {};
    void* ws = attn_states_;
    attn_states_ = nullptr;  // no dangling member should the regrow throw
    attn_states_n_ = 0;
    attn_states_ = static_cast<float*>(regrow_workspace(ws, static_cast<size_t>(floats) * sizeof(float)));
    attn_states_n_ = static_cast<size_t>(floats);
  }
  cuda::AttentionSplit split;
  split.parts = parts;
  split.states = attn_states_;
  return split;
}

void CudaBackend::attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                            const KvCacheRef& cache, int64_t block_size, const BlockTables& tables, const int32_t* pos,
                            int64_t window, float scale, ActivationsOut out) {
  SHARDLM_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "cuda backend: n_heads " << n_heads << " is not a multiple of n_kv_heads " << n_kv_heads);
  SHARDLM_CHECK(head_dim <= 256, "cuda backend: attention supports head_dim up to 256, not " << head_dim);
  // With prefill attention on tensor cores, an eager step's runs of a sequence's tokens (prefill
  // chunks) attend there; its single tokens (decode), if any, on the fp32 kernels first, the runs'
  // positions masked (kernels/cuda/run_positions.h).
  if (attn_bf16_ && !capturing_ && tables.host_start != nullptr) {
    const cuda::PrefillMmaTiles plan =
        cuda::prefill_attention_mma_tiles(tables.host_start, T, n_heads / n_kv_heads, /*singles=*/false);
    if (plan.one_head + plan.packed > 0) {
      split_step(
          pos, tables, T,
          [&](const int32_t* single_pos) {
            attention_fp32(q, T, n_heads, n_kv_heads, head_dim, cache, block_size, tables, single_pos, window, scale,
                           /*chunk_step=*/false, out);
          },
          [&] {
            attention_bf16(plan, q, n_heads, n_kv_heads, head_dim, cache, block_size, tables, pos, window, scale, out);
          });
      return;
    }
  }
  attention_fp32(q, T, n_heads, n_kv_heads, head_dim, cache, block_size, tables, pos, window, scale,
                 !capturing_ && mostly_chunks(tables, T), out);
}

// Prefill chunks without a sliding window share each staged round across a tile of their tokens
// (the same bits as the per-token kernel); decode steps run per token. The split is weighed on
// the grid the step would launch unsplit (a tile's tokens share a block), and a split step runs
// per token.
void CudaBackend::attention_fp32(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                 const KvCacheRef& cache, int64_t block_size, const BlockTables& tables,
                                 const int32_t* pos, int64_t window, float scale, bool chunk_step, ActivationsOut out) {
  last_attention_bf16_ = false;
  last_attention_singles_ = 0;
  const bool chunks = window <= 0 && chunk_step;
  const int64_t tile = chunks ? cuda::paged_attention_tile_tokens(head_dim) : 1;
  const cuda::AttentionSplit split = attention_split(
      cuda::paged_attention_blocks((T + tile - 1) / tile, n_heads, n_kv_heads), T, n_heads, head_dim, tables, window);
  last_attention_parts_ = split.parts;
  last_attention_tiled_ = chunks && split.parts <= 1;
  if (last_attention_tiled_) {
    cuda::paged_attention_tiled(q, T, n_heads, n_kv_heads, head_dim, cache.k, cache.v, cache_format(cache), block_size,
                                tables.blocks, tables.start, pos, window, scale, out.f32, out.bf16, stream_of(stream_));
    check_launch("paged_attention_tiled");
    return;
  }
  cuda::paged_attention(q, T, n_heads, n_kv_heads, head_dim, cache.k, cache.v, cache_format(cache), block_size,
                        tables.blocks, tables.start, pos, window, scale, out.f32, out.bf16, split, stream_of(stream_));
  check_launch("paged_attention");
}

// A step with runs on tensor cores: its single tokens, if any, first through fp32(positions with
// the runs' tokens masked to -1, a device workspace), then its runs through tensor_cores(). The
// last_attention_* figures say both: the fp32 launch's partitions, the single tokens.
void CudaBackend::split_step(const int32_t* pos, const BlockTables& tables, int64_t T,
                             const std::function<void(const int32_t*)>& fp32,
                             const std::function<void()>& tensor_cores) {
  int64_t singles = 0;
  for (int64_t t = 0; t < T; ++t) singles += !cuda::in_run(tables.host_start, T, t);
  int64_t parts = 1;
  if (singles > 0) {
    int32_t* masked = grown_workspace(single_pos_, single_pos_n_, static_cast<size_t>(T), "single-token positions");
    cuda::launch_single_token_positions(pos, tables.start, T, masked, stream_of(stream_));
    check_launch("single_token_positions");
    fp32(masked);
    parts = last_attention_parts_;
  }
  tensor_cores();
  last_attention_parts_ = parts;
  last_attention_singles_ = singles;
}

// The tiles of a tensor-core launch on the device: up from pageable memory (the copy returns once
// the host list is read) into a buffer that only grows. Every layer of a step has the same tiles,
// so only the step's first layer copies them.
const int32_t* CudaBackend::upload_attention_tiles(const std::vector<int32_t>& tiles) {
  if (tiles.size() > attn_tiles_n_) {
    void* ws = attn_tiles_;
    attn_tiles_ = nullptr;
    attn_tiles_n_ = 0;
    attn_tiles_host_.clear();
    attn_tiles_ = static_cast<int32_t*>(regrow_workspace(ws, tiles.size() * sizeof(int32_t)));
    attn_tiles_n_ = tiles.size();
  }
  if (tiles != attn_tiles_host_) {
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(attn_tiles_, tiles.data(), tiles.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_of(stream_)));
    attn_tiles_host_ = tiles;
  }
  last_attention_parts_ = 1;
  last_attention_tiled_ = true;
  last_attention_bf16_ = true;
  return attn_tiles_;
}

// Prefill chunks on tensor cores: the step's sequences' runs cut every 64 tokens, one query head a
// tile; the short ones in a second launch, a KV head's query heads a tile.
void CudaBackend::attention_bf16(const cuda::PrefillMmaTiles& plan, const float* q, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, const KvCacheRef& cache, int64_t block_size,
                                 const BlockTables& tables, const int32_t* pos, int64_t window, float scale,
                                 ActivationsOut out) {
  const int32_t* d_tiles = upload_attention_tiles(plan.tiles);
  last_attention_packed_tiles_ = plan.packed;
  if (plan.one_head > 0) {
    cuda::prefill_attention_mma(q, n_heads, n_kv_heads, head_dim, cache.k, cache.v, cache_format(cache), block_size,
                                tables.blocks, tables.start, pos, window, scale, d_tiles, plan.one_head, 1, out.f32,
                                out.bf16, stream_of(stream_));
    check_launch("prefill_attention_mma");
  }
  if (plan.packed > 0) {
    cuda::prefill_attention_mma(q, n_heads, n_kv_heads, head_dim, cache.k, cache.v, cache_format(cache), block_size,
                                tables.blocks, tables.start, pos, window, scale, d_tiles + 2 * plan.one_head,
                                plan.packed, plan.packed_heads, out.f32, out.bf16, stream_of(stream_));
    check_launch("prefill_attention_mma (packed heads)");
  }
}

// MLA prefill chunks on tensor cores: 16 (token, head) pairs of a sequence's run a tile.
void CudaBackend::latent_attention_bf16(const std::vector<int32_t>& tiles, const float* q_latent, const float* q_rope,
                                        int64_t n_heads, int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache,
                                        int64_t block_size, const BlockTables& tables, const int32_t* pos, float scale,
                                        float* out) {
  const int32_t* d_tiles = upload_attention_tiles(tiles);
  cuda::prefill_latent_attention_mma(q_latent, q_rope, n_heads, kv_lora, rope_dim, cache.k, cache_format(cache),
                                     block_size, tables.blocks, tables.start, pos, scale, d_tiles,
                                     static_cast<int64_t>(tiles.size() / 3), out, stream_of(stream_));
  check_launch("prefill_latent_attention_mma");
}

void CudaBackend::latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads,
                                   int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache, int64_t block_size,
                                   const BlockTables& tables, const int32_t* pos, float scale, float* out) {
  SHARDLM_CHECK(kv_lora <= 512 && rope_dim <= 64,
                "cuda backend: latent attention supports kv_lora_rank up to 512 and "
                "qk_rope_head_dim up to 64, not "
                    << kv_lora << " and " << rope_dim);
  // As attention(): runs on tensor cores, single tokens on the fp32 kernel with the runs masked.
  if (attn_bf16_ && !capturing_ && tables.host_start != nullptr) {
    const std::vector<int32_t> tiles =
        cuda::prefill_latent_attention_mma_tiles(tables.host_start, T, n_heads, /*singles=*/false);
    if (!tiles.empty()) {
      split_step(
          pos, tables, T,
          [&](const int32_t* single_pos) {
            latent_attention_decode(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, cache, block_size, tables,
                                    single_pos, scale, out);
          },
          [&] {
            latent_attention_bf16(tiles, q_latent, q_rope, n_heads, kv_lora, rope_dim, cache, block_size, tables, pos,
                                  scale, out);
          });
      return;
    }
  }
  latent_attention_decode(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, cache, block_size, tables, pos, scale, out);
}

// Every token of the launch on its own, split along the positions when the device would be short
// of work: on tensor cores with decode attention in bf16 (which needs the prefill chunks there too,
// so that a step the host sees whole never runs its chunks on the decode kernel by this switch
// alone), else on the fp32 kernel.
void CudaBackend::latent_attention_decode(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads,
                                          int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache,
                                          int64_t block_size, const BlockTables& tables, const int32_t* pos,
                                          float scale, float* out) {
  const bool mma = decode_attention_bf16();
  const cuda::AttentionSplit split = attention_split(
      mma ? cuda::decode_latent_attention_mma_blocks(T, n_heads) : cuda::latent_attention_blocks(T, n_heads), T,
      n_heads, kv_lora, tables, 0);
  last_attention_parts_ = split.parts;
  last_attention_tiled_ = false;
  last_attention_bf16_ = mma;
  last_attention_singles_ = 0;
  if (mma) {
    cuda::decode_latent_attention_mma(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, cache.k, cache_format(cache),
                                      block_size, tables.blocks, tables.start, pos, scale, out, split,
                                      stream_of(stream_));
    check_launch("decode_latent_attention_mma");
    return;
  }
  cuda::latent_attention(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, cache.k, cache_format(cache), block_size,
                         tables.blocks, tables.start, pos, scale, out, split, stream_of(stream_));
  check_launch("latent_attention");
}

}  // namespace shardlm
