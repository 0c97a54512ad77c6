// bf16 as 16-bit patterns, one definition for the host code, the CPU kernels and the CUDA kernels
// (a weight converted at load, a KV cache value stored and read back): from_f32 rounds to nearest
// even (torch's .to(bfloat16) for finite values; a NaN stays a quiet NaN with its sign), to_f32
// widens exactly, a 16-bit shift. So every backend stores the same bits for the same value.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace shardlm::bf16_bits {

SHARDLM_HD inline uint16_t from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

SHARDLM_HD inline float to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A row's value in fp32 whichever form the row is held in (fp32 as it is, bf16 widened), for
// kernels written once over both.
SHARDLM_HD inline float widen(float f) { return f; }
SHARDLM_HD inline float widen(uint16_t h) { return to_f32(h); }

}  // namespace shardlm::bf16_bits
