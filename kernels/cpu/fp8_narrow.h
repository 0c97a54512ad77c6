// Sixteen floats to fp8 e4m3fn codes at once (internal to the CPU kernels): fp8_bits::from_f32 of
// each lane, bit for bit (nearest even, saturating to +-448, NaN kept with its sign), without its
// branches, so that a row quantises at memory speed rather than a code at a time.
//  - normal codes (|x| >= 2^-6): from_f32's integer rounding of the mantissa, lane by lane;
//  - subnormal codes (k * 2^-9, k = 0..8): |x| * 2^9 is exact, and adding then subtracting 2^23
//    rounds it to the nearest integer, ties to even (the kernels build with -ffp-contract=off, and
//    no fast-math);
//  - then each lane picks its case, as from_f32's branches do.
// quantise_group_e4m3 quantises a group of values as the W8A8 GEMMs' activations are
// (kernels/cpu/fp8_act_quant.h) and the fp8 wire's rows (kernels/cpu/wire_fp8.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/vec16.h"
#include "fp8_bits.h"

namespace shardlm::cpu::detail {

typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint8_t v16b __attribute__((vector_size(16)));

inline v16b narrow16_e4m3(v16f x) {
  v16u u;
  std::memcpy(&u, &x, sizeof u);
  const v16u sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  const v16u normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  v16f mag;
  std::memcpy(&mag, &a, sizeof mag);
  // Only the subnormal lanes' magnitudes (the others would overflow the conversion to integer).
  const v16f small = select16(a < 0x3c800000u, mag, v16f{});
  const v16f k = (small * 512.0f + 8388608.0f) - 8388608.0f;
  const v16u sub = __builtin_convertvector(k, v16u);
  // Each comparison gives all ones or zeros per lane: pick the case as from_f32 does.
  const v16u is_nan = reinterpret_cast<v16u>(a > 0x7f800000u), is_sat = reinterpret_cast<v16u>(a >= 0x43e00000u);
  const v16u is_normal = reinterpret_cast<v16u>(a >= 0x3c800000u);
  v16u code = (is_normal & normal) | (~is_normal & sub);
  code = (is_sat & 0x7eu) | (~is_sat & code);
  code = (is_nan & 0x7fu) | (~is_nan & code);
  return __builtin_convertvector(sign | code, v16b);
}

// The largest magnitude of x[0..n), NaNs skipped (fp8_bits::nan_skipping_max), 0 for none.
inline float group_amax(const float* x, int64_t n) {
  v16f m{};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    v16u u;
    const v16f v = load16(x + k);
    std::memcpy(&u, &v, sizeof u);
    u &= 0x7fffffffu;
    v16f a;
    std::memcpy(&a, &u, sizeof a);
    m = select16(a > m, a, m);  // false for NaN
  }
  float amax = 0.0f;
  for (int l = 0; l < 16; ++l) amax = fp8_bits::nan_skipping_max(amax, m[l]);
  for (; k < n; ++k) amax = fp8_bits::nan_skipping_max(amax, std::fabs(x[k]));
  return amax;
}

// x[0..n) to codes[0..n): s = fp8_bits::act_scale(max |x|), codes[k] = from_f32(x[k] / s);
// returns s.
inline float quantise_group_e4m3(const float* x, int64_t n, uint8_t* codes) {
  const float s = fp8_bits::act_scale(group_amax(x, n));
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const v16b q = narrow16_e4m3(load16(x + k) / s);
    std::memcpy(codes + k, &q, sizeof q);
  }
  for (; k < n; ++k) codes[k] = fp8_bits::from_f32(x[k] / s);
  return s;
}

}  // namespace shardlm::cpu::detail
