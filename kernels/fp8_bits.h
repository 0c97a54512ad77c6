// fp8 e4m3fn as 8-bit codes, one definition for the host code, the CPU kernels and the CUDA
// kernels (a weight dequantised at load, a KV cache value stored and read back), as bf16_bits.h is
// for bf16. e4m3fn: sign | 4 exponent bits (bias 7) | 3 mantissa bits; exponent 0 is subnormal
// (m * 2^-9), S.1111.111 is NaN, there is no infinity, the largest finite value is 0x7e = 448.
//  - from_f32 rounds to nearest even and saturates to +-448, infinities included (the "satfinite"
//    conversion of the H100/H200 cvt instruction and of vLLM's and TensorRT-LLM's fp8 KV caches;
//    torch 2.15's .to(float8_e4m3fn) saturates too); a NaN stays NaN with its sign.
//  - to_f32 is exact, in integer operations only (no subnormal fp32 arithmetic, so a device or
//    host flushing denormals gives the same bits); a NaN code gives the default quiet NaN with its
//    sign.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace shardlm::fp8_bits {

constexpr float kMax = 448.0f;

// The scale of a block of activations quantised to e4m3 (W8A8 GEMMs, kernels/cpu/fp8_act_quant.h):
// its largest magnitude maps to 448, as DeepSeek-V3's reference act_quant does; an all-zero block
// takes 1 so that its codes are zeros rather than 0/0. Below 448 x the smallest subnormal the
// quotient underflows to 0: the smallest subnormal (2^-149) then still maps the block into
// [-448, 448], and its zeros stay zeros (not 0/0), as the weights' quantiser does (fp8_block.cpp).
SHARDLM_HD inline float act_scale(float amax) {
  if (!(amax > 0.0f)) return 1.0f;
  const float s = amax / kMax;
  return s > 0.0f ? s : 1.40129846e-45f;
}

// A running maximum of magnitudes that skips NaNs, quiet or signalling, as the GPU's fmaxf does
// (glibc's fmax returns NaN for a signalling one, which would lose the values before it).
SHARDLM_HD inline float nan_skipping_max(float acc, float a) { return a > acc ? a : acc; }

SHARDLM_HD inline uint8_t from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;   // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448 (464 and up would round past it): saturate
  if (a >= 0x3c800000u) {                    // >= 2^-6: normal e4m3
    // Round the 23-bit mantissa to 3 bits, nearest even; a carry moves into the exponent.
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    return sign | static_cast<uint8_t>((r >> 20) - (120u << 3));  // rebias 127 -> 7
  }
  // Subnormal e4m3: k * 2^-9, k = 0..8 (k = 8 is 2^-6, code 0x08, the smallest normal). Below
  // 2^-6 the value is a * 2^-9 in units of 2^-9 with a's 24-bit significand: shift it down to k,
  // rounding to nearest even, in integers.
  const uint32_t e = a >> 23;
  if (e < 127 - 10) return sign;                     // below 2^-10, half the smallest subnormal: rounds to zero
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;  // value = sig * 2^(e - 150)
  const uint32_t shift = 150u - 9u - e;              // value / 2^-9 = sig >> shift, 21 <= shift <= 24
  const uint32_t k = sig >> shift, rest = sig & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return sign | static_cast<uint8_t>(k + (rest > half || (rest == half && (k & 1u))));
}

SHARDLM_HD inline float to_f32(uint8_t v) {
  const uint32_t sign = (static_cast<uint32_t>(v) & 0x80u) << 24;
  const uint32_t e = (v >> 3) & 0xfu, m = v & 0x7u;
  uint32_t u;
  if ((v & 0x7fu) == 0x7fu) {
    u = sign | 0x7fc00000u;
  } else if (e == 0) {
    // m * 2^-9 normalised: m = 1 is 2^-9, m = 2..3 is 2^-8 x (1 + ..), m = 4..7 is 2^-7 x (1 + ..).
    if (m == 0) {
      u = sign;
    } else {
      const uint32_t lead = m >= 4 ? 2u : (m >= 2 ? 1u : 0u);
      u = sign | ((127u - 9u + lead) << 23) | ((m << (23u - lead)) & 0x7fffffu);
    }
  } else {
    u = sign | ((e + 120u) << 23) | (m << 20);  // exponent rebiased 7 -> 127
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace shardlm::fp8_bits
