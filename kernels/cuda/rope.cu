#include "cuda/rope.h"

#include "cuda/launch_util.cuh"
#include "cuda/rope_pair.cuh"

namespace shardlm::cuda {
namespace {

// One thread per (token, head, pair i < half): it reads both elements of its pair before writing
// them, so the in-place rotation has no cross-thread hazard.
__device__ inline void rotate_pair(float* x, int64_t n_heads, int64_t head_dim, int64_t half, int64_t i,
                                   const int32_t* pos, const float* inv_freq) {
  const int64_t th = i / half, k = i % half;  // th = t * n_heads + h
  const int64_t t = th / n_heads;
  float* v = x + th * head_dim;
  const RopePair r = rope_pair(v[k], v[k + half], static_cast<float>(pos[t]), inv_freq[k]);
  v[k] = r.first;
  v[k + half] = r.second;
}

__global__ void rope_rotate_half_kernel(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                                        const float* inv_freq) {
  const int64_t half = head_dim / 2;
  const int64_t n = T * n_heads * half;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads())
    rotate_pair(x, n_heads, head_dim, half, i, pos, inv_freq);
}

// The queries' pairs first, then the keys'.
__global__ void rope_rotate_half_qk_kernel(float* q, int64_t q_heads, float* k, int64_t k_heads, int64_t T,
                                           int64_t head_dim, const int32_t* pos, const float* inv_freq) {
  const int64_t half = head_dim / 2;
  const int64_t nq = T * q_heads * half, n = nq + T * k_heads * half;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    if (i < nq)
      rotate_pair(q, q_heads, head_dim, half, i, pos, inv_freq);
    else
      rotate_pair(k, k_heads, head_dim, half, i - nq, pos, inv_freq);
  }
}

// One thread block per (token, head). The interleaved form reads pair (2i, 2i+1) and writes slots
// (i, i+half), which crosses threads, so the vector is staged in shared memory first: that is what
// keeps out == x safe.
__global__ void rope_strided_kernel(const float* x, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                                    int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                                    float attention_factor, float* out) {
  extern __shared__ float v[];
  const int64_t th = blockIdx.x;
  const int64_t t = th / n_heads, h = th % n_heads;
  const int64_t half = rot_dim / 2;
  const float* src = x + t * x_stride + h * head_stride;
  for (int64_t i = threadIdx.x; i < rot_dim; i += blockDim.x) v[i] = src[i];
  __syncthreads();
  const float p = static_cast<float>(pos[t]);
  float* o = out + th * rot_dim;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float x1 = interleaved ? v[2 * i] : v[i];
    const float x2 = interleaved ? v[2 * i + 1] : v[i + half];
    const RopePair r = rope_pair_scaled(x1, x2, p, inv_freq[i], attention_factor);
    o[i] = r.first;
    o[i + half] = r.second;
  }
}

}  // namespace

void rope_rotate_half(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                      const float* inv_freq, cudaStream_t stream) {
  const int64_t n = T * n_heads * (head_dim / 2);
  if (n <= 0) return;
  rope_rotate_half_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(
      x, T, n_heads, head_dim, pos, inv_freq);
}

void rope_rotate_half_qk(float* q, int64_t q_heads, float* k, int64_t k_heads, int64_t T, int64_t head_dim,
                         const int32_t* pos, const float* inv_freq, cudaStream_t stream) {
  const int64_t n = T * (q_heads + k_heads) * (head_dim / 2);
  if (n <= 0) return;
  rope_rotate_half_qk_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(
      q, q_heads, k, k_heads, T, head_dim, pos, inv_freq);
}

void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t rot_dim,
                  const int32_t* pos, const float* inv_freq, bool interleaved, float attention_factor, float* out,
                  cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || rot_dim <= 0) return;
  // rot_dim is a rope head (64 for DeepSeek/Kimi), so 64 threads cover a pair each.
  constexpr int kThreads = 64;
  const size_t smem = static_cast<size_t>(rot_dim) * sizeof(float);
  rope_strided_kernel<<<static_cast<unsigned>(T * n_heads), kThreads, smem, stream>>>(
      x, n_heads, x_stride, head_stride, rot_dim, pos, inv_freq, interleaved, attention_factor, out);
}

}  // namespace shardlm::cuda
