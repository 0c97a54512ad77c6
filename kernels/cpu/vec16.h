// A vector of 16 floats for the CPU kernels' inner loops (internal to the CPU kernels): GCC and
// clang lower it to whatever vector width the target has (one AVX-512 register, two AVX, four
// SSE or NEON), so code written on it builds everywhere and does the same operations.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace shardlm::cpu::detail {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof v); }

// The last n % 16 floats of x[0..n), padded with -inf to a whole vector in tail (exp(-inf) = 0,
// and -inf never wins a max); returns where they start.
inline int64_t pad_tail16(const float* x, int64_t n, float tail[16]) {
  const int64_t full = n / 16 * 16;
  for (int64_t l = 0; l < 16; ++l) tail[l] = full + l < n ? x[full + l] : -std::numeric_limits<float>::infinity();
  return full;
}

// mask ? a : b, where mask lanes are all ones or all zeros (what a vector comparison gives).
inline v16f select16(v16i mask, v16f a, v16f b) {
  return reinterpret_cast<v16f>((reinterpret_cast<v16i>(a) & mask) | (reinterpret_cast<v16i>(b) & ~mask));
}

// The largest of x[0..n) over 16 lanes (NaN skipped; -inf when there is none); fills tail as
// pad_tail16 does, for the caller's next pass.
inline float max16(const float* x, int64_t n, float tail[16]) {
  const int64_t full = pad_tail16(x, n, tail);
  v16f m = v16f{} - std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j <= full; j += 16) {
    const v16f v = load16(j < full ? x + j : tail);
    m = select16(v > m, v, m);  // false for NaN: a lane keeps its maximum
  }
  float mx = m[0];
  for (int l = 1; l < 16; ++l) mx = m[l] > mx ? m[l] : mx;
  return mx;
}

}  // namespace shardlm::cpu::detail
