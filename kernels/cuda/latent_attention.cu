// Same scheme as paged_attention.cu (attention_util.cuh): one thread block per (token, group of up
// to kAttnHeadsPerBlock heads), one warp per head; every head reads the same latent cache, so each
// round's rows are staged in shared memory once per block instead of read once per head. The key
// is the whole row (latent and rope parts), the value its latent part. Position partitions and the
// split launch are paged_attention.cu's.
#include "cuda/latent_attention.h"

#include "cuda/attention_combine.h"
#include "cuda/attention_util.cuh"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kMaxLora = 512;
constexpr int kMaxRope = 64;
constexpr int kLoraPerLane = kMaxLora / 32;
constexpr int kRopePerLane = kMaxRope / 32;
constexpr int kTile = detail::kAttnTile;
constexpr int kMaxThreads = detail::kAttnHeadsPerBlock * 32;
// A round's staged rows sit the largest row apart in shared memory, whatever the model's: each
// row's loads are then at fixed offsets from one address (paged_attention.cu's kRowStride).
constexpr int kRowStride = kMaxLora + kMaxRope;

__global__ void latent_cache_write_kernel(const float* latent, const float* k_rope, int64_t T, const int64_t* slots,
                                          int64_t kv_lora, int64_t rope_dim, void* cache, KvFormat fmt) {
  const int64_t row = kv_lora + rope_dim;
  const int64_t n = T * row;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const int64_t t = i / row, c = i % row;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    kv_store(cache, slot * row + c, c < kv_lora ? latent[t * kv_lora + c] : k_rope[t * rope_dim + (c - kv_lora)],
             fmt.elem, fmt.k_scale);
  }
}

// Folds positions [a0, a1] into a warp's state (m, l, acc) from empty, as paged_attention.cu's
// fold_positions does.
__device__ __forceinline__ void fold_positions(int a0, int a1, const float (&ql)[kLoraPerLane],
                                               const float (&qr)[kRopePerLane], bool active, int kv_lora, int rope_dim,
                                               const void* cache, KvFormat fmt, const int32_t* bt, int64_t block_size,
                                               float scale, float* sc, float& m, float& l, float (&acc)[kLoraPerLane]) {
  const int lane = threadIdx.x & 31;
  const int row = kv_lora + rope_dim;
  detail::warp_state_reset(m, l, acc);
  for (int base = a0; base <= a1; base += kTile) {
    const int cnt = detail::round_count(base, a1);
    // The whole block stages the round's rows (attention_util.cuh's stage_rows).
    {
      const int64_t* slots = detail::round_slots(bt, base, cnt, block_size);
      float* const dst[1] = {sc};
      const void* const side[1] = {cache};
      const float side_scale[1] = {fmt.k_scale};
      detail::stage_rows<1, kRowStride>(dst, side, side_scale, fmt.elem, slots, cnt, row, 0, row);
    }
    __syncthreads();
    if (active) {
      // Every lane's dims of every row, without a test: past kv_lora (rope_dim) the query is zero
      // and the row holds its rope part or the zeros past its end.
      float s[kTile];
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        s[j] = 0.0f;  // rows past cnt were not staged this round: their sums go unused
        const float* c = sc + j * kRowStride + lane;
#pragma unroll
        for (int k = 0; k < kLoraPerLane; ++k) s[j] += ql[k] * c[32 * k];
#pragma unroll
        for (int k = 0; k < kRopePerLane; ++k) s[j] += qr[k] * c[kv_lora + 32 * k];
        // Unrolled without a branch, ptxas would load every row before the first product and spill
        // them (about 950 bytes a thread); a warp barrier every few rows holds it to those rows.
        if (j % 4 == 3) __syncwarp();
      }
      // The value is the latent part of the same rows.
      detail::warp_fold_round(s, cnt, scale, sc, kRowStride, m, l, acc);
    }
    __syncthreads();  // sc is restaged by the next round
  }
}

// blockIdx.x = t * blocks_per_token + b; warp w takes head b * heads_per_block + w, idle past
// n_heads (idle warps still stage rows and meet every barrier). gridDim.y > 1: a split launch, as
// in paged_attention.cu. Two blocks a multiprocessor: up to 128 registers (sm_90a: 118, none spilled).
__global__ void __launch_bounds__(kMaxThreads, 2)
    latent_attention_kernel(const float* q_latent, const float* q_rope, int64_t n_heads, int kv_lora, int rope_dim,
                            const void* cache, KvFormat fmt, int64_t block_size, const int32_t* blocks,
                            const int32_t* table_start, const int32_t* pos, float scale, float* out,
                            int heads_per_block, int blocks_per_token, float* states) {
  __shared__ float sc[kTile * kRowStride];  // the round's cache rows [cnt][kRowStride]
  const int64_t t = blockIdx.x / blocks_per_token;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = static_cast<int64_t>(blockIdx.x % blocks_per_token) * heads_per_block + warp;
  const bool active = h < n_heads;  // warp-uniform
  const int64_t th = t * n_heads + h;
  float* o = out + th * kv_lora;

  // Which partitions this block folds; every condition below is the same for the whole block.
  const int p1 = pos[t];
  if (p1 < 0) {  // padding token
    if (active && blockIdx.y == 0) {
      for (int d = lane; d < kv_lora; d += 32) o[d] = 0.0f;
    }
    return;
  }
  const detail::PartitionWalk w = detail::partition_walk(0, p1);  // no sliding window: from position 0
  if (w.empty()) return;
  const int32_t* bt = blocks + table_start[t];
  // The dots read every lane's dims without a test (past kv_lora and rope_dim the query is zero
  // and a row holds its rope part or these zeros): a test per dim and row took more predicates than
  // ptxas had registers for, and about half of a round's instructions moved them.
  detail::zero_row_tails(sc, kv_lora + rope_dim, kRowStride);

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
  float M = -INFINITY, L = 0.0f;  // the merged state of the partitions before (unsplit launch)
  for (int k = w.first; k <= w.last; ++k) {
    float m, l, acc[kLoraPerLane];
    fold_positions(w.begin(k), w.end(k), ql, qr, active, kv_lora, rope_dim, cache, fmt, bt, block_size, scale, sc, m, l,
                   acc);
    if (active) detail::warp_finish_partition(k, w, w.state(states, th, kv_lora, k), o, kv_lora, m, l, acc, M, L);
  }
}

}  // namespace

void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                        int64_t rope_dim, void* cache, KvFormat cache_fmt, cudaStream_t stream) {
  const int64_t n = T * (kv_lora + rope_dim);
  if (T <= 0 || n <= 0) return;
  latent_cache_write_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(
      latent, k_rope, T, slots, kv_lora, rope_dim, cache, cache_fmt);
}

void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                      int64_t rope_dim, const void* cache, KvFormat cache_fmt, int64_t block_size,
                      const int32_t* blocks, const int32_t* table_start, const int32_t* pos, float scale, float* out,
                      const AttentionSplit& split, cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || kv_lora <= 0) return;
  const int heads_per_block =
      static_cast<int>(n_heads < detail::kAttnHeadsPerBlock ? n_heads : detail::kAttnHeadsPerBlock);
  const int blocks_per_token = static_cast<int>((n_heads + heads_per_block - 1) / heads_per_block);
  const int64_t parts = split.parts > 1 ? split.parts : 1;
  const dim3 grid(static_cast<unsigned>(T * blocks_per_token), static_cast<unsigned>(parts));
  latent_attention_kernel<<<grid, heads_per_block * 32, 0, stream>>>(
      q_latent, q_rope, n_heads, static_cast<int>(kv_lora), static_cast<int>(rope_dim), cache, cache_fmt, block_size,
      blocks, table_start, pos, scale, out, heads_per_block, blocks_per_token, parts > 1 ? split.states : nullptr);
  if (parts > 1) attention_combine(T, n_heads, kv_lora, pos, 0, parts, split.states, out, nullptr, stream);
}

int64_t latent_attention_blocks(int64_t T, int64_t n_heads) {
  if (T <= 0 || n_heads <= 0) return 0;
  const int64_t heads_per_block = n_heads < detail::kAttnHeadsPerBlock ? n_heads : detail::kAttnHeadsPerBlock;
  return T * ((n_heads + heads_per_block - 1) / heads_per_block);
}

}  // namespace shardlm::cuda
