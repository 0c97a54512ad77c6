// Gated activations (the device form of cpu/activation.h). Device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// out[i] = silu(gate[i]) * up[i]  (SwiGLU), silu(g) = g / (1 + exp(-g)). out may alias gate or up.
// twin: null, or [n] that receives out rounded to bf16 (bf16_bits::from_f32), for the down
// projection's GEMM to read instead of casting out again.
void silu_mul(const float* gate, const float* up, float* out, uint16_t* twin, int64_t n, cudaStream_t stream);

// The same on a stacked gate/up projection's output: out [rows, width] = silu(gate) * up, where row
// r of gate_up [rows, 2 * width] holds gate's row r, then up's; each element and twin as silu_mul
// gives it. out must not overlap gate_up.
void silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, float* out, uint16_t* twin,
                      cudaStream_t stream);

}  // namespace shardlm::cuda
