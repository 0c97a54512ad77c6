// Floats to bf16 a row at a time (internal to the CPU kernels): bf16_bits::from_f32 of each value,
// bit for bit (nearest even, a NaN quiet with its sign), sixteen lanes at once without its branch,
// so that a row packs at memory speed rather than a value at a time; and the exact widening back.
#pragma once

#include <cstdint>
#include <cstring>

#include "bf16_bits.h"
#include "cpu/vec16.h"

namespace shardlm::cpu::detail {

typedef uint32_t v16w __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

inline void narrow_bf16(const float* x, int64_t n, uint16_t* d) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    v16w u;
    std::memcpy(&u, x + k, sizeof u);
    const v16w is_nan = reinterpret_cast<v16w>((u & 0x7fffffffu) > 0x7f800000u);
    const v16w rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const v16w h = (is_nan & ((u >> 16) | 0x40u)) | (~is_nan & rounded);
    const v16h out = __builtin_convertvector(h, v16h);
    std::memcpy(d + k, &out, sizeof out);
  }
  for (; k < n; ++k) d[k] = bf16_bits::from_f32(x[k]);
}

inline void widen_bf16(const uint16_t* s, int64_t n, float* x) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    v16h h;
    std::memcpy(&h, s + k, sizeof h);
    const v16w u = __builtin_convertvector(h, v16w) << 16;
    std::memcpy(x + k, &u, sizeof u);
  }
  for (; k < n; ++k) x[k] = bf16_bits::to_f32(s[k]);
}

}  // namespace shardlm::cpu::detail
