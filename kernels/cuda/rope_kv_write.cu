// One warp per (token, head), the queries' heads first, then the keys'. A warp stages its head in
// shared memory, because the norm needs the whole head before it can scale any element and a
// rotate-half pair (i, i + half) need not lie in one lane; then it writes the head back normed and
// rotated and, for a key head, stores the key and the value rows of that head in the cache.
#include "cuda/rope_kv_write.h"

#include "cuda/rmsnorm_row.cuh"
#include "cuda/rope_pair.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kWarps = 8;  // heads per block
static_assert(kWarps * kRopeKvWriteMaxHeadDim * sizeof(float) <= 48 * 1024, "a block's heads fit its shared memory");

__global__ void rope_kv_write_kernel(float* q, int q_heads, float* k, const float* v, int kv_heads, int64_t T,
                                     int head_dim, const float* q_norm, const float* k_norm, float eps,
                                     const int32_t* pos, const float* inv_freq, const int64_t* slots, void* k_cache,
                                     void* v_cache, KvFormat fmt) {
  extern __shared__ float stage[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int heads = q_heads + kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  // A whole warp leaves together, and nothing after this synchronises the block.
  if (item >= T * heads) return;
  const int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const bool is_key = h >= q_heads;
  const int kh = h - q_heads;
  float* x = is_key ? k + (t * kv_heads + kh) * head_dim : q + (t * q_heads + h) * head_dim;
  const float* norm = is_key ? k_norm : q_norm;
  float* s = stage + warp * head_dim;
  for (int i = lane; i < head_dim; i += 32) s[i] = x[i];
  __syncwarp();
  if (norm) {
    const float r = inv_rms(warp_sumsq_in_rmsnorm_order(s, head_dim), head_dim, eps);
    for (int i = lane; i < head_dim; i += 32) s[i] = norm[i] * (s[i] * r);
    __syncwarp();
  }
  const int half = head_dim / 2;
  const float p = static_cast<float>(pos[t]);
  for (int i = lane; i < half; i += 32) {
    const RopePair r = rope_pair(s[i], s[i + half], p, inv_freq[i]);
    s[i] = r.first;
    s[i + half] = r.second;
  }
  __syncwarp();
  // An odd head's last element is not in a pair and stays as it is, as rope leaves it.
  for (int i = lane; i < head_dim; i += 32) x[i] = s[i];
  if (!is_key) return;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t row = static_cast<int64_t>(kv_heads) * head_dim;
  const int64_t src = (t * kv_heads + kh) * head_dim, dst = slot * row + static_cast<int64_t>(kh) * head_dim;
  for (int i = lane; i < head_dim; i += 32) {
    kv_store(k_cache, dst + i, s[i], fmt.elem, fmt.k_scale);
    kv_store(v_cache, dst + i, v[src + i], fmt.elem, fmt.v_scale);
  }
}

}  // namespace

void rope_kv_write(float* q, int64_t q_heads, float* k, const float* v, int64_t kv_heads, int64_t T, int64_t head_dim,
                   const float* q_norm, const float* k_norm, float eps, const int32_t* pos, const float* inv_freq,
                   const int64_t* slots, void* k_cache, void* v_cache, KvFormat cache_fmt, cudaStream_t stream) {
  const int64_t items = T * (q_heads + kv_heads);
  if (items <= 0 || head_dim <= 0) return;
  const unsigned blocks = static_cast<unsigned>((items + kWarps - 1) / kWarps);
  const size_t smem = static_cast<size_t>(kWarps) * static_cast<size_t>(head_dim) * sizeof(float);
  rope_kv_write_kernel<<<blocks, kWarps * 32, smem, stream>>>(
      q, static_cast<int>(q_heads), k, v, static_cast<int>(kv_heads), T, static_cast<int>(head_dim), q_norm, k_norm,
      eps, pos, inv_freq, slots, k_cache, v_cache, cache_fmt);
}

}  // namespace shardlm::cuda
