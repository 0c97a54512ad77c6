// exp of 16 floats at once, for the CPU kernels' softmax, and of 8 doubles, for the host sampler's
// probabilities (internal to the CPU kernels).
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

namespace shardlm::cpu::detail {

typedef double v8d __attribute__((vector_size(64)));
typedef int64_t v8l __attribute__((vector_size(64)));

inline v8d select8d(v8l mask, v8d a, v8d b) {
  return reinterpret_cast<v8d>((reinterpret_cast<v8l>(a) & mask) | (reinterpret_cast<v8l>(b) & ~mask));
}

// 2^n for integers n in [-1022, 1023], built in the exponent field.
inline v8d pow2_8d(v8l n) { return reinterpret_cast<v8d>((n + 1023) << 52); }

// exp of 8 doubles, for the host sampler's probabilities (which are then rounded to float). The
// same method as exp16 in double: ln 2 split with a 32-bit high part (n * ln2_hi exact for |n| <
// 2^21) and exp(r), |r| <= ln2 / 2, as its degree-13 Taylor polynomial (truncation below 5e-18)
// in Estrin's form. Within 1.01 ulp of the exact value over a million arguments
// (tests/kernels/test_vector_exp.cpp); rounded to float it gives what libm's exp rounded to
// float gives, except where the exact value lies within that ulp of a float rounding boundary
// (about one argument in 2^29; none of 4 million in the test). Arguments below -708 give about
// 3e-308 instead of a subnormal (0 in float either way), above 709.7 they saturate; exp(-inf) is
// that same tiny value, NaN in gives NaN out.
inline v8d exp8d(v8d x) {
  const v8d lo = v8d{} - 708.0, hi = v8d{} + 709.7;
  x = select8d(x < lo, lo, x);
  x = select8d(x > hi, hi, x);
  const v8d round_shift = v8d{} + 6755399441055744.0;  // 1.5 * 2^52
  const v8d t = x * 1.4426950408889634074 + round_shift;
  const v8d nf = t - round_shift;
  // t's low mantissa bits hold n itself (two's complement, |n| < 2^51): no conversion instruction
  // needed (AVX2 has none for double to int64). NaN lanes give some n; y is NaN there anyway.
  const v8l n = reinterpret_cast<v8l>(t) - reinterpret_cast<v8l>(round_shift);
  const v8d r = (x - nf * 6.93147180369123816490e-01) - nf * 1.90821492927058770002e-10;
  // exp(r) = 1 + r + r^2 P(r), P in Estrin's form (pairs, then powers r^2 and r^4): a quarter of
  // Horner's dependent steps, which is what bounds a loop of these; the 1 and r added last keep
  // the rounding within an ulp.
  const v8d r2 = r * r, r4 = r2 * r2;
  const v8d q23 = r * (1.0 / 6.0) + 0.5, q45 = r * (1.0 / 120.0) + 1.0 / 24.0;
  const v8d q67 = r * (1.0 / 5040.0) + 1.0 / 720.0, q89 = r * (1.0 / 362880.0) + 1.0 / 40320.0;
  const v8d q1011 = r * (1.0 / 39916800.0) + 1.0 / 3628800.0;
  const v8d q1213 = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
  const v8d s0 = q45 * r2 + q23, s1 = q89 * r2 + q67, s2 = q1213 * r2 + q1011;
  const v8d poly = (s2 * r4 + s1) * r4 + s0;
  const v8d y = (poly * r2 + r) + 1.0;
  const v8l n1 = n >> 1;
  return y * pow2_8d(n1) * pow2_8d(n - n1);
}

}  // namespace shardlm::cpu::detail
