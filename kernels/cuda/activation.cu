#include "cuda/activation.h"

#include "bf16_bits.h"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

// Same expression and order as the CPU: (g / (1 + exp(-g))) * up. expf here is the accurate
// (non fast-math) one, within 2 ulp of the CPU's. Both kernels store through here, so a stacked
// projection's activation has the bits of the separate one's.
__device__ __forceinline__ void put_silu_mul(float g, float u, float* out, uint16_t* twin, int64_t i) {
  const float v = g / (1.0f + expf(-g)) * u;
  out[i] = v;
  if (twin) twin[i] = bf16_bits::from_f32(v);  // null or not for the whole launch
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, uint16_t* twin, int64_t n) {
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads())
    put_silu_mul(gate[i], up[i], out, twin, i);
}

__global__ void silu_mul_stacked_kernel(const float* gate_up, int64_t width, float* out, uint16_t* twin, int64_t n) {
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const int64_t r = i / width;
    const float* row = gate_up + r * width;  // row r of gate_up starts at 2 r width: r width past i's row
    put_silu_mul(row[i], row[i + width], out, twin, i);
  }
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, uint16_t* twin, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  silu_mul_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(gate, up, out, twin, n);
}

void silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, float* out, uint16_t* twin,
                      cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return;
  silu_mul_stacked_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(gate_up, width,
                                                                                                     out, twin, n);
}

}  // namespace shardlm::cuda
