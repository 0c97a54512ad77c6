// Gated activations.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// out[i] = silu(gate[i]) * up[i]  (SwiGLU). out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// The same on a stacked gate/up projection's output: out [rows, width] = silu(gate) * up, where row
// r of gate_up [rows, 2 * width] holds gate's row r, then up's; each element silu_mul's bits. out
// must not overlap gate_up.
void silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, float* out);
// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace shardlm::cpu
