// One thread block per (token, group of up to kAttnHeadsPerBlock query heads of one KV head), one
// warp per query head (attention_util.cuh): each round the block stages kAttnTile positions' K and
// V rows of its KV head in shared memory, so a GQA group reads its KV once, not once per query
// head. The result is sum_j exp(s_j - m) v_j / sum_j exp(s_j - m), which equals the CPU's
// normalised form up to rounding.
#include "cuda/paged_attention.h"

#include "cuda/attention_util.cuh"
#include "cuda/block_reduce.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kDimPerLane = kMaxHeadDim / 32;
constexpr int kTile = detail::kAttnTile;
constexpr int kMaxThreads = detail::kAttnHeadsPerBlock * 32;

// blockIdx.x = (t * n_kv_heads + kv head) * blocks_per_kv + b; warp w takes query head
// kvh * group + b * heads_per_block + w, idle when that is past the group (a group that does not
// divide evenly); idle warps still stage rows and meet every barrier.
__global__ void __launch_bounds__(kMaxThreads)
    paged_attention_kernel(const float* q, int64_t n_heads, int64_t n_kv_heads, int head_dim, const float* k_cache,
                           const float* v_cache, int64_t block_size, const int32_t* blocks, const int32_t* table_start,
                           const int32_t* pos, int64_t window, float scale, float* out, int heads_per_block,
                           int blocks_per_kv) {
  __shared__ float sk[kTile * kMaxHeadDim];
  __shared__ float sv[kTile * kMaxHeadDim];
  const int64_t group = n_heads / n_kv_heads;
  const int64_t tk = blockIdx.x / blocks_per_kv;  // t * n_kv_heads + kvh
  const int64_t t = tk / n_kv_heads, kvh = tk % n_kv_heads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t in_group = static_cast<int64_t>(blockIdx.x % blocks_per_kv) * heads_per_block + warp;
  const bool active = in_group < group;  // warp-uniform
  const int64_t h = kvh * group + in_group;
  const int64_t row = n_kv_heads * head_dim;
  float* o = out + (t * n_heads + h) * head_dim;

  const int64_t p1 = pos[t];
  const int64_t p0 = window > 0 ? (p1 - window + 1 > 0 ? p1 - window + 1 : 0) : 0;
  if (p1 < p0) {  // padding token; the condition is the same for the whole block
    if (active) {
      for (int d = lane; d < head_dim; d += 32) o[d] = 0.0f;
    }
    return;
  }
  const int32_t* bt = blocks + table_start[t];

  float qr[kDimPerLane];
#pragma unroll
  for (int k = 0; k < kDimPerLane; ++k) {
    const int d = lane + 32 * k;
    qr[k] = active && d < head_dim ? q[(t * n_heads + h) * head_dim + d] : 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  float acc[kDimPerLane];
#pragma unroll
  for (int a = 0; a < kDimPerLane; ++a) acc[a] = 0.0f;

  for (int64_t base = p0; base <= p1; base += kTile) {
    const int cnt = static_cast<int>(p1 - base + 1 < kTile ? p1 - base + 1 : kTile);
    // The whole block stages the round's rows (consecutive threads, consecutive dims of a row).
    for (int i = threadIdx.x; i < cnt * head_dim; i += blockDim.x) {
      const int j = i / head_dim, d = i - j * head_dim;
      const int64_t off = detail::cache_slot(bt, base + j, block_size) * row + kvh * head_dim + d;
      sk[i] = k_cache[off];
      sv[i] = v_cache[off];
    }
    __syncthreads();
    if (active) {
      float s[kTile];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        if (j >= cnt) break;  // cnt is the same in every lane, as warp_sum requires
        float part = 0.0f;
#pragma unroll
        for (int k = 0; k < kDimPerLane; ++k) {
          const int d = lane + 32 * k;
          if (d < head_dim) part += qr[k] * sk[j * head_dim + d];
        }
        s[j] = warp_sum(part) * scale;
        tile_max = fmaxf(tile_max, s[j]);
      }
      detail::warp_fold_tile(s, cnt, tile_max, sv, head_dim, head_dim, m, l, acc);
    }
    __syncthreads();  // sk / sv are restaged by the next round
  }
  if (active) detail::warp_write_normalised(o, head_dim, l, acc);
}

}  // namespace

void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const float* k_cache, const float* v_cache, int64_t block_size, const int32_t* blocks,
                     const int32_t* table_start, const int32_t* pos, int64_t window, float scale, float* out,
                     cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0) return;
  const int64_t group = n_heads / n_kv_heads;
  if (group <= 0) return;  // fewer query than KV heads: not a layout (the backend refuses it)
  const int heads_per_block = static_cast<int>(group < detail::kAttnHeadsPerBlock ? group : detail::kAttnHeadsPerBlock);
  const int blocks_per_kv = static_cast<int>((group + heads_per_block - 1) / heads_per_block);
  paged_attention_kernel<<<static_cast<unsigned>(T * n_kv_heads * blocks_per_kv), heads_per_block * 32, 0, stream>>>(
      q, n_heads, n_kv_heads, static_cast<int>(head_dim), k_cache, v_cache, block_size, blocks, table_start, pos,
      window, scale, out, heads_per_block, blocks_per_kv);
}

}  // namespace shardlm::cuda
