// Internal helpers shared by the CPU kernels (not part of the kernel interface).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace shardlm::cpu::detail {

// Fixed-order fp32 dot product: 16 lane partial sums (lane l takes k = l, l+16, ...), then the
// tree (l, l+8), (l, l+4), (l, l+2), (0, 1). The order depends only on n.
inline float dot16(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[k + l] * b[k + l];
  for (int l = 0; k + l < n; ++l) acc[l] += a[k + l] * b[k + l];
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  for (int l = 0; l < 2; ++l) acc[l] += acc[l + 2];
  return acc[0] + acc[1];
}

inline float sumsq16(const float* __restrict a, int64_t n) { return dot16(a, a, n); }

// Scores s[0..n) become softmax probabilities in place, in a fixed order: the max, then
// e_j = exp(s_j - max) and their sum in increasing j, then each e_j times 1 / sum. n == 0 is a
// no-op (a padding token's empty row).
inline void softmax_in_place(float* s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

}  // namespace shardlm::cpu::detail
