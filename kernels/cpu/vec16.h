// A vector of 16 floats for the CPU kernels' inner loops (internal to the CPU kernels): GCC and
// clang lower it to whatever vector width the target has (one AVX-512 register, two AVX, four
// SSE or NEON), so code written on it builds everywhere and does the same operations.
#pragma once

#include <cstdint>
#include <cstring>

namespace shardlm::cpu::detail {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof v); }

// mask ? a : b, where mask lanes are all ones or all zeros (what a vector comparison gives).
inline v16f select16(v16i mask, v16f a, v16f b) {
  return reinterpret_cast<v16f>((reinterpret_cast<v16i>(a) & mask) | (reinterpret_cast<v16i>(b) & ~mask));
}

}  // namespace shardlm::cpu::detail
