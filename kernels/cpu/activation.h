// Gated activations.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// out[i] = silu(gate[i]) * up[i]  (SwiGLU). out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace shardlm::cpu
