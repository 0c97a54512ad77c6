// Same scheme as paged_attention.cu (one thread block per (token, head), online softmax over rounds
// of kAttnChunk positions, a warp per score, every thread folding the round), with the key split in
// its latent and rope parts and the value being the latent itself.
#include "cuda/latent_attention.h"

#include "cuda/attention_util.cuh"
#include "cuda/block_reduce.cuh"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxLora = 512;
constexpr int kMaxRope = 64;
constexpr int kLoraPerLane = kMaxLora / 32;
constexpr int kRopePerLane = kMaxRope / 32;
constexpr int kAccPerThread = kMaxLora / kThreads;
constexpr int kChunk = detail::kAttnChunk;

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

__global__ void __launch_bounds__(kThreads)
    latent_attention_kernel(const float* q_latent, const float* q_rope, int64_t n_heads, int64_t kv_lora,
                            int64_t rope_dim, const float* cache, int64_t block_size, const int32_t* blocks,
                            const int32_t* table_start, const int32_t* pos, float scale, float* out) {
  __shared__ float sc[kChunk];
  __shared__ int64_t srow[kChunk];  // offset of position j's cache row
  const int64_t th = blockIdx.x;    // t * n_heads + h
  const int64_t t = th / n_heads;
  const int64_t row = kv_lora + rope_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* o = out + th * kv_lora;

  const int64_t n = static_cast<int64_t>(pos[t]) + 1;
  if (n <= 0) {  // padding token; the condition is the same for the whole block
    for (int64_t d = threadIdx.x; d < kv_lora; d += kThreads) o[d] = 0.0f;
    return;
  }
  const int32_t* bt = blocks + table_start[t];

  const float* qlv = q_latent + th * kv_lora;
  const float* qrv = q_rope + th * rope_dim;
  float ql[kLoraPerLane], qr[kRopePerLane];
#pragma unroll
  for (int k = 0; k < kLoraPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    ql[k] = d < kv_lora ? qlv[d] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kRopePerLane; ++k) {
    const int64_t d = lane + 32 * k;
    qr[k] = d < rope_dim ? qrv[d] : 0.0f;
  }

  float m = -INFINITY, l = 0.0f;
  float acc[kAccPerThread];
#pragma unroll
  for (int a = 0; a < kAccPerThread; ++a) acc[a] = 0.0f;

  for (int64_t base = 0; base < n; base += kChunk) {
    const int cnt = static_cast<int>(n - base < kChunk ? n - base : kChunk);
    // Warp-uniform loop: every lane of a warp runs the same iterations, as warp_sum requires.
    for (int j = warp; j < cnt; j += kWarps) {
      const int64_t off = detail::cache_slot(bt, base + j, block_size) * row;
      const float* c = cache + off;
      float sl = 0.0f, sr = 0.0f;
#pragma unroll
      for (int k = 0; k < kLoraPerLane; ++k) {
        const int64_t d = lane + 32 * k;
        if (d < kv_lora) sl += ql[k] * c[d];
      }
#pragma unroll
      for (int k = 0; k < kRopePerLane; ++k) {
        const int64_t d = lane + 32 * k;
        if (d < rope_dim) sr += qr[k] * c[kv_lora + d];
      }
      sl = warp_sum(sl);
      sr = warp_sum(sr);
      if (lane == 0) {
        sc[j] = (sl + sr) * scale;
        srow[j] = off;
      }
    }
    __syncthreads();
    detail::fold_round<kThreads>(sc, srow, cnt, cache, kv_lora, m, l, acc);
    __syncthreads();  // sc / srow are rewritten by the next round
  }
  detail::write_normalised<kThreads>(o, kv_lora, l, acc);
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
  latent_attention_kernel<<<static_cast<unsigned>(T * n_heads), kThreads, 0, stream>>>(
      q_latent, q_rope, n_heads, kv_lora, rope_dim, cache, block_size, blocks, table_start, pos, scale, out);
}

}  // namespace shardlm::cuda
