// Conversions two at a time on the instructions Ada and Hopper have for them: e4m3 codes read, fp32
// values rounded to bf16. They give the values of the integer forms in fp8_bits.h and bf16_bits.h,
// which the emulated device (and a GPU older than sm_89) runs instead:
//  - e4m3x2_to_f16x2 (device, sm_89 and later): the two codes in one half of a word, the lower
//    byte first, as an f16 pair (cvt.rn.f16x2.e4m3x2; the half is taken by a move ptxas folds into
//    the conversion's operand);
//  - e4m3x2_to_f32: two codes, the lower byte first, as fp32 (that conversion, then each f16
//    to fp32): exact, since every e4m3 value, subnormals included, is an f16. A NaN code gives a
//    NaN (the GPU's, 0x7fffffff, where fp8_bits::to_f32 gives 0x7fc00000 with the code's sign).
//  - f32x2_to_bf16x2: two fp32 values rounded to nearest even into a bf16 pair, the first in the
//    low half (cvt.rn.bf16x2.f32), subnormals kept. A NaN gives a NaN (0x7fff, where
//    bf16_bits::from_f32 keeps the sign and the top of the payload).
// The integer forms take several instructions an element (to_f32 tests for NaN and subnormal
// codes); here a pair of codes takes three (one conversion, two widenings), a pair of roundings one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "bf16_bits.h"
#include "fp8_bits.h"

namespace shardlm::cuda::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
template <int Half>
__device__ inline uint32_t e4m3x2_to_f16x2(uint32_t v) {
  uint32_t h;
  if constexpr (Half == 0)
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h) : "r"(v));
  else
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(h) : "r"(v));
  return h;
}
#endif

__device__ inline void e4m3x2_to_f32(uint32_t v, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t h = e4m3x2_to_f16x2<0>(v);
  asm("{.reg .f16 l, u;\n\tmov.b32 {l, u}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, u;\n\t}"
      : "=f"(lo), "=f"(hi)
      : "r"(h));
#else
  lo = fp8_bits::to_f32(static_cast<uint8_t>(v));
  hi = fp8_bits::to_f32(static_cast<uint8_t>(v >> 8));
#endif
}

// One code (the low byte of v).
__device__ inline float e4m3_to_f32(uint32_t v) {
  float lo, hi;
  e4m3x2_to_f32(v & 0xffu, lo, hi);
  return lo;
}

__device__ inline uint32_t f32x2_to_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t p;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(hi), "f"(lo));  // the first operand to the high half
  return p;
#else
  return static_cast<uint32_t>(bf16_bits::from_f32(lo)) | (static_cast<uint32_t>(bf16_bits::from_f32(hi)) << 16);
#endif
}

// One value rounded to bf16.
__device__ inline uint16_t f32_to_bf16(float v) { return static_cast<uint16_t>(f32x2_to_bf16x2(v, 0.0f)); }

}  // namespace shardlm::cuda::detail
