#include "cuda/activation.h"

#include "bf16_bits.h"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

// Same expression and order as the CPU: (g / (1 + exp(-g))) * up. expf here is the accurate
// (non fast-math) one, within 2 ulp of the CPU's.
__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, uint16_t* twin, int64_t n) {
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const float g = gate[i];
    const float v = g / (1.0f + expf(-g)) * up[i];
    out[i] = v;
    if (twin) twin[i] = bf16_bits::from_f32(v);  // null or not for the whole launch
  }
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, uint16_t* twin, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  silu_mul_kernel<<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(gate, up, out, twin, n);
}

}  // namespace shardlm::cuda
