// Same scheme as paged_attention.cu (attention_util.cuh): one thread block per (token, group of up
// to kAttnHeadsPerBlock heads), one warp per head; every head reads the same latent cache, so each
// round's rows are staged in shared memory once per block instead of read once per head. The key
// is the whole row (latent and rope parts), the value its latent part.
#include "cuda/latent_attention.h"

#include "cuda/attention_util.cuh"
#include "cuda/block_reduce.cuh"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kMaxLora = 512;
constexpr int kMaxRope = 64;
constexpr int kLoraPerLane = kMaxLora / 32;
constexpr int kRopePerLane = kMaxRope / 32;
constexpr int kTile = detail::kAttnTile;
constexpr int kMaxThreads = detail::kAttnHeadsPerBlock * 32;

__global__ void latent_cache_write_kernel(const float* latent, const float* k_rope, int64_t T, const int64_t* slots,
                                          int64_t kv_lora, int64_t rope_dim, float* cache) {
  const int64_t row = kv_lora + rope_dim;
  const int64_t n = T * row;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const int64_t t = i / row, c = i % row;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    cache[slot * row + c] = c < kv_lora ? latent[t * kv_lora + c] : k_rope[t * rope_dim + (c - kv_lora)];
  }
}

// blockIdx.x = t * blocks_per_token + b; warp w takes head b * heads_per_block + w, idle past
// n_heads (idle warps still stage rows and meet every barrier).
__global__ void __launch_bounds__(kMaxThreads)
    latent_attention_kernel(const float* q_latent, const float* q_rope, int64_t n_heads, int kv_lora, int rope_dim,
                            const float* cache, int64_t block_size, const int32_t* blocks, const int32_t* table_start,
                            const int32_t* pos, float scale, float* out, int heads_per_block, int blocks_per_token) {
  __shared__ float sc[kTile * (kMaxLora + kMaxRope)];  // the round's cache rows [cnt][row]
  const int64_t t = blockIdx.x / blocks_per_token;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = static_cast<int64_t>(blockIdx.x % blocks_per_token) * heads_per_block + warp;
  const bool active = h < n_heads;  // warp-uniform
  const int row = kv_lora + rope_dim;
  const int64_t th = t * n_heads + h;
  float* o = out + th * kv_lora;

  const int64_t n = static_cast<int64_t>(pos[t]) + 1;
  if (n <= 0) {  // padding token; the condition is the same for the whole block
    if (active) {
      for (int d = lane; d < kv_lora; d += 32) o[d] = 0.0f;
    }
    return;
  }
  const int32_t* bt = blocks + table_start[t];

  float ql[kLoraPerLane], qr[kRopePerLane];
#pragma unroll
  for (int k = 0; k < kLoraPerLane; ++k) {
    const int d = lane + 32 * k;
    ql[k] = active && d < kv_lora ? q_latent[th * kv_lora + d] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kRopePerLane; ++k) {
    const int d = lane + 32 * k;
    qr[k] = active && d < rope_dim ? q_rope[th * rope_dim + d] : 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  float acc[kLoraPerLane];
#pragma unroll
  for (int a = 0; a < kLoraPerLane; ++a) acc[a] = 0.0f;

  for (int64_t base = 0; base < n; base += kTile) {
    const int cnt = static_cast<int>(n - base < kTile ? n - base : kTile);
    // The whole block stages the round's rows (consecutive threads, consecutive columns of a row).
    for (int i = threadIdx.x; i < cnt * row; i += blockDim.x) {
      const int j = i / row, c = i - j * row;
      sc[i] = cache[detail::cache_slot(bt, base + j, block_size) * row + c];
    }
    __syncthreads();
    if (active) {
      float s[kTile];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        if (j >= cnt) break;  // cnt is the same in every lane, as warp_sum requires
        const float* c = sc + j * row;
        float part = 0.0f;
#pragma unroll
        for (int k = 0; k < kLoraPerLane; ++k) {
          const int d = lane + 32 * k;
          if (d < kv_lora) part += ql[k] * c[d];
        }
#pragma unroll
        for (int k = 0; k < kRopePerLane; ++k) {
          const int d = lane + 32 * k;
          if (d < rope_dim) part += qr[k] * c[kv_lora + d];
        }
        s[j] = warp_sum(part) * scale;
        tile_max = fmaxf(tile_max, s[j]);
      }
      // The value is the latent part of the same rows.
      detail::warp_fold_tile(s, cnt, tile_max, sc, row, kv_lora, m, l, acc);
    }
    __syncthreads();  // sc is restaged by the next round
  }
  if (active) detail::warp_write_normalised(o, kv_lora, l, acc);
}

}  // namespace

void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                        int64_t rope_dim, float* cache, cudaStream_t stream) {
  const int64_t n = T * (kv_lora + rope_dim);
  if (T <= 0 || n <= 0) return;
  latent_cache_write_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(
      latent, k_rope, T, slots, kv_lora, rope_dim, cache);
}

void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                      int64_t rope_dim, const float* cache, int64_t block_size, const int32_t* blocks,
                      const int32_t* table_start, const int32_t* pos, float scale, float* out, cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || kv_lora <= 0) return;
  const int heads_per_block =
      static_cast<int>(n_heads < detail::kAttnHeadsPerBlock ? n_heads : detail::kAttnHeadsPerBlock);
  const int blocks_per_token = static_cast<int>((n_heads + heads_per_block - 1) / heads_per_block);
  latent_attention_kernel<<<static_cast<unsigned>(T * blocks_per_token), heads_per_block * 32, 0, stream>>>(
      q_latent, q_rope, n_heads, static_cast<int>(kv_lora), static_cast<int>(rope_dim), cache, block_size, blocks,
      table_start, pos, scale, out, heads_per_block, blocks_per_token);
}

}  // namespace shardlm::cuda
