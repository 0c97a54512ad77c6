// Rotary position embedding (the device forms of cpu/rope.h and cpu/rope_strided.h). The angle is
// float(pos[t]) * inv_freq[i] in fp32, then cosf / sinf, as on the CPU; llama3 and YaRN scaling live
// in the host-computed inv_freq table and attention_factor. All pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// Rotate-half layout, in place. x: [T, n_heads, head_dim]; pos: [T]; inv_freq: [head_dim / 2].
void rope_rotate_half(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                      const float* inv_freq, cudaStream_t stream);

// The same on a layer's queries q [T, q_heads, head_dim] and keys k [T, k_heads, head_dim] in one
// launch: each element's arithmetic is rope_rotate_half's.
void rope_rotate_half_qk(float* q, int64_t q_heads, float* k, int64_t k_heads, int64_t T, int64_t head_dim,
                         const int32_t* pos, const float* inv_freq, cudaStream_t stream);

// Strided input, packed output [T, n_heads, rot_dim], rotate-half or interleaved (DeepSeek) pairs,
// cos and sin multiplied by attention_factor; exactly cpu::rope_strided's contract. out may equal x
// when x is packed (x_stride == n_heads*rot_dim, head_stride == rot_dim); other overlaps are not
// allowed.
void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t rot_dim,
                  const int32_t* pos, const float* inv_freq, bool interleaved, float attention_factor, float* out,
                  cudaStream_t stream);

}  // namespace shardlm::cuda
