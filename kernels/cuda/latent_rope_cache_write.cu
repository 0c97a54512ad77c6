// Two kinds of block in one grid. The first T blocks take a token each: they norm its latent as
// rmsnorm's block does (block_rmsnorm_row: the same sum order), rotate its rope key (staged in
// shared memory, as rope_strided stages it, since an interleaved pair is written elsewhere than it
// is read) and store the cache row; each thread stores the elements it computed itself. The
// blocks after them take 8 query heads each, a warp a head, and rotate the head's rope part into
// q_rope (no staging: q_rope is another buffer).
#include "cuda/latent_rope_cache_write.h"

#include "cuda/rmsnorm_row.cuh"
#include "cuda/rope_pair.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kHeadsPerBlock = kRmsnormThreads / 32;

__device__ inline RopePair rotated(const float* x, int64_t i, int64_t half, float p, const LatentRope& rope) {
  const float x1 = rope.interleaved ? x[2 * i] : x[i];
  const float x2 = rope.interleaved ? x[2 * i + 1] : x[i + half];
  return rope_pair_scaled(x1, x2, p, rope.inv_freq[i], rope.attention_factor);
}

__global__ void __launch_bounds__(kRmsnormThreads)
    latent_rope_cache_write_kernel(float* latent, const float* norm_w, float eps, float* k_rope, const float* q,
                                   int64_t n_heads, int64_t q_stride, int64_t q_head_stride, float* q_rope, int64_t T,
                                   int64_t kv_lora, int64_t rope_dim, LatentRope rope, const int64_t* slots,
                                   void* cache, KvFormat fmt) {
  const int64_t half = rope_dim / 2;
  if (static_cast<int64_t>(blockIdx.x) >= T) {  // query heads: the same for the whole block
    const int64_t item = (static_cast<int64_t>(blockIdx.x) - T) * kHeadsPerBlock + (threadIdx.x >> 5);
    if (item >= T * n_heads) return;
    const int64_t t = item / n_heads, h = item % n_heads;
    const float* x = q + t * q_stride + h * q_head_stride;
    float* o = q_rope + item * rope_dim;
    const float p = static_cast<float>(rope.pos[t]);
    for (int64_t i = threadIdx.x & 31; i < half; i += 32) {
      const RopePair r = rotated(x, i, half, p, rope);
      o[i] = r.first;
      o[i + half] = r.second;
    }
    return;
  }
  __shared__ float staged[kLatentRopeMaxDim];
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  const int64_t row = kv_lora + rope_dim;
  float* lat = latent + t * kv_lora;
  block_rmsnorm_row(lat, norm_w, kv_lora, eps, [&](int64_t i, float v) {
    lat[i] = v;
    if (slot >= 0) kv_store(cache, slot * row + i, v, fmt.elem, fmt.k_scale);
  });
  float* kr = k_rope + t * rope_dim;
  for (int64_t i = threadIdx.x; i < rope_dim; i += blockDim.x) staged[i] = kr[i];
  __syncthreads();
  const float p = static_cast<float>(rope.pos[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const RopePair r = rotated(staged, i, half, p, rope);
    kr[i] = r.first;
    kr[i + half] = r.second;
    if (slot >= 0) {
      kv_store(cache, slot * row + kv_lora + i, r.first, fmt.elem, fmt.k_scale);
      kv_store(cache, slot * row + kv_lora + i + half, r.second, fmt.elem, fmt.k_scale);
    }
  }
}

}  // namespace

void latent_rope_cache_write(float* latent, const float* norm_w, float eps, float* k_rope, const float* q,
                             int64_t n_heads, int64_t q_stride, int64_t q_head_stride, float* q_rope, int64_t T,
                             int64_t kv_lora, int64_t rope_dim, const LatentRope& rope, const int64_t* slots,
                             void* cache, KvFormat cache_fmt, cudaStream_t stream) {
  if (T <= 0) return;
  const int64_t head_blocks = (T * n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  latent_rope_cache_write_kernel<<<static_cast<unsigned>(T + head_blocks), kRmsnormThreads, 0, stream>>>(
      latent, norm_w, eps, k_rope, q, n_heads, q_stride, q_head_stride, q_rope, T, kv_lora, rope_dim, rope, slots,
      cache, cache_fmt);
}

}  // namespace shardlm::cuda
