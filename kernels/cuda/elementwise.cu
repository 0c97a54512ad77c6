#include "cuda/elementwise.h"

#include "bf16_bits.h"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) y[i] += x[i];
}

__global__ void add_bias_rows_kernel(float* y, int64_t M, int64_t N, const float* bias) {
  const int64_t n = M * N;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) y[i] += bias[i % N];
}

// The host's conversion itself (not __float2bfloat16_rn), so the two agree on every input, NaN
// payloads included, as do the twins rmsnorm and silu_mul write.
__global__ void f32_to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) y[i] = bf16_bits::from_f32(x[i]);
}

__global__ void bf16_to_f32_kernel(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads())
    y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

}  // namespace

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_inplace_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(y, x, n);
}

void add_bias_rows(float* y, int64_t M, int64_t N, const float* bias, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return;
  add_bias_rows_kernel<<<detail::elementwise_blocks(M * N), detail::kElementwiseThreads, 0, stream>>>(y, M, N, bias);
}

void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(x, y, n);
}

void bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(x, y, n);
}

}  // namespace shardlm::cuda
