// Internal helpers shared by the CPU kernels (not part of the kernel interface).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/vec16.h"
#include "cpu/vector_exp.h"

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

// Scores s[0..n) become softmax probabilities in place, in a fixed order that depends only on n:
// the max; e_j = exp16(s_j - max), summed like dot16 (16 lane partials, lane l taking j = l,
// l+16, ..., then its tree); each e_j times 1 / sum. n == 0 is a no-op (a padding token's empty
// row).
inline void softmax_in_place(float* s, int64_t n) {
  if (n <= 0) return;
  float tail[16];
  const float mx = max16(s, n, tail);
  const int64_t full = n / 16 * 16;
  const v16f vmx = v16f{} + mx;
  v16f acc{};
  for (int64_t j = 0; j < full; j += 16) {
    const v16f e = exp16(load16(s + j) - vmx);
    store16(s + j, e);
    acc += e;
  }
  const v16f e = exp16(load16(tail) - vmx);
  acc += e;  // lanes past n add exp(-inf) = +0, which leaves a lane's sum as it was
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  for (int l = 0; l < 2; ++l) acc[l] += acc[l + 2];
  const float inv = 1.0f / (acc[0] + acc[1]);
  for (int64_t j = 0; j < full; ++j) s[j] *= inv;
  for (int64_t j = full; j < n; ++j) s[j] = e[j - full] * inv;
}

}  // namespace shardlm::cpu::detail
