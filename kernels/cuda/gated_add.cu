#include "cuda/gated_add.h"

namespace shardlm::cuda {
namespace {

__global__ void gated_add_kernel(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) {
  const int64_t n = T * H;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / H;
    const float g = gate_logits ? 1.0f / (1.0f + expf(-gate_logits[t])) : 1.0f;
    out[i] += g * y[i];
  }
}

}  // namespace

void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H, cudaStream_t stream) {
  const int64_t n = T * H;
  if (n <= 0) return;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  gated_add_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(out, y, gate_logits,
                                                                                                   T, H);
}

}  // namespace shardlm::cuda
