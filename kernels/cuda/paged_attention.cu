// One thread block per (token, head), online softmax in fp32 over the attended positions in
// increasing order, kAttnChunk positions per round:
//  * scores: each warp takes positions j = warp, warp + kWarps, ... of the round; its lanes split
//    head_dim (lane l takes d = l, l+32, ...) and warp_sum reduces them;
//  * fold: every thread reads the round's scores from shared memory and updates the same running
//    max and sum (the same arithmetic in every thread, so all agree), then accumulates its own
//    output dims d = tid, tid + kThreads.
// The result is sum_j exp(s_j - m) v_j / sum_j exp(s_j - m), which equals the CPU's normalised
// form up to rounding.
#include "cuda/paged_attention.h"

#include "cuda/attention_util.cuh"
#include "cuda/block_reduce.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHeadDim = 256;
constexpr int kQPerLane = kMaxHeadDim / 32;
constexpr int kAccPerThread = kMaxHeadDim / kThreads;
constexpr int kChunk = detail::kAttnChunk;

__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                           const float* k_cache, const float* v_cache, int64_t block_size, const int32_t* blocks,
                           const int32_t* table_start, const int32_t* pos, int64_t window, float scale,
                           float* out) {
  __shared__ float sc[kChunk];
  __shared__ int64_t srow[kChunk];  // offset of position j's (slot, kv head) row in the caches
  const int64_t th = blockIdx.x;    // t * n_heads + h
  const int64_t t = th / n_heads, h = th % n_heads;
  const int64_t kvh = h / (n_heads / n_kv_heads);
  const int64_t row = n_kv_heads * head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* o = out + th * head_dim;

  const int64_t p1 = pos[t];
  const int64_t p0 = window > 0 ? (p1 - window + 1 > 0 ? p1 - window + 1 : 0) : 0;
  if (p1 < p0) {  // padding token; the condition is the same for the whole block
    for (int64_t d = threadIdx.x; d < head_dim; d += kThreads) o[d] = 0.0f;
    return;
  }
  const int32_t* bt = blocks + table_start[t];

  const float* qv = q + th * head_dim;
  float qr[kQPerLane];
#pragma unroll
  for (int k = 0; k < kQPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    qr[k] = d < head_dim ? qv[d] : 0.0f;
  }

  float m = -INFINITY, l = 0.0f;
  float acc[kAccPerThread];
#pragma unroll
  for (int a = 0; a < kAccPerThread; ++a) acc[a] = 0.0f;

  for (int64_t base = p0; base <= p1; base += kChunk) {
    const int cnt = static_cast<int>(p1 - base + 1 < kChunk ? p1 - base + 1 : kChunk);
    // Warp-uniform loop: every lane of a warp runs the same iterations, as warp_sum requires.
    for (int j = warp; j < cnt; j += kWarps) {
      const int64_t off = detail::cache_slot(bt, base + j, block_size) * row + kvh * head_dim;
      const float* kr = k_cache + off;
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < kQPerLane; ++k) {
        const int64_t d = lane + 32 * k;
        if (d < head_dim) s += qr[k] * kr[d];
      }
      s = warp_sum(s);
      if (lane == 0) {
        sc[j] = s * scale;
        srow[j] = off;
      }
    }
    __syncthreads();
    detail::fold_round<kThreads>(sc, srow, cnt, v_cache, head_dim, m, l, acc);
    __syncthreads();  // sc / srow are rewritten by the next round
  }
  detail::write_normalised<kThreads>(o, head_dim, l, acc);
}

}  // namespace

void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const float* k_cache, const float* v_cache, int64_t block_size, const int32_t* blocks,
                     const int32_t* table_start, const int32_t* pos, int64_t window, float scale, float* out,
                     cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || head_dim <= 0) return;
  paged_attention_kernel<<<static_cast<unsigned>(T * n_heads), kThreads, 0, stream>>>(
      q, n_heads, n_kv_heads, head_dim, k_cache, v_cache, block_size, blocks, table_start, pos, window, scale, out);
}

}  // namespace shardlm::cuda
