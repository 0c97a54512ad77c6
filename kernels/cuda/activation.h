// Gated activations (the device form of cpu/activation.h). Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// out[i] = silu(gate[i]) * up[i]  (SwiGLU), silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

}  // namespace shardlm::cuda
