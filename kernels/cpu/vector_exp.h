// exp of 16 floats at once, for the CPU kernels' softmax (internal to the CPU kernels).
//
// libm's expf is a call per element, so a softmax over a row of scores ran at one exponential
// every few nanoseconds, a third of prefill attention's time. This one is the textbook method in
// vector form:
//   exp(x) = 2^n * exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2],
// with ln 2 split in two (Cody and Waite) so that n * ln2_hi is exact, and exp(r) a degree-6
// minimax polynomial. tests/kernels/test_vector_exp.cpp measures it against the correctly rounded
// exp: within 1 ulp over the normal range, results below FLT_MIN (x < -87.34) as subnormals or
// zero, +inf above 88.72, exp(0) = 1 and exp(-inf) = 0 exactly, NaN in, NaN out.
//
// Only +, -, * and comparisons, built like every CPU kernel without contraction into fused
// multiply-adds: the bits are the same on any x86-64 or Arm target, with or without AVX-512.
#pragma once

#include <cstdint>

#include "cpu/vec16.h"

namespace shardlm::cpu::detail {

// 2^n for integers n in [-126, 127], built in the exponent field.
inline v16f pow2_16(v16i n) { return reinterpret_cast<v16f>((n + 127) << 23); }

inline v16f exp16(v16f x) {
  // Past these exp(x) is 0 or +inf in float; clamping keeps n small enough for two pow2_16 factors.
  const v16f lo = v16f{} - 104.0f, hi = v16f{} + 88.8f;
  x = select16(x < lo, lo, x);
  x = select16(x > hi, hi, x);
  const v16f round_shift = v16f{} + 12582912.0f;  // 1.5 * 2^23: (t + it) - it rounds t to an integer
  const v16f nf = (x * 1.44269504088896341f + round_shift) - round_shift;
  // ln 2 = ln2_hi + ln2_lo, ln2_hi with 9 significant bits, so nf * ln2_hi is exact for |n| < 2^15.
  const v16f r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f;
  v16f p = v16f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const v16f y = p * (r * r) + r + 1.0f;
  // 2^n as two exact factors: n runs from -150 to 128, past what one exponent field holds; the
  // first product is exact and the second rounds once, into a subnormal or to +inf where due.
  const v16i n = __builtin_convertvector(select16(nf == nf, nf, v16f{}), v16i);  // NaN lanes stay NaN in y
  const v16i n1 = n >> 1;
  return y * pow2_16(n1) * pow2_16(n - n1);
}

}  // namespace shardlm::cpu::detail
