// The bf16 KV cache's rounding, one definition for the CPU kernels and the CUDA ones: an fp32
// value is stored rounded to nearest even (torch's .to(bfloat16) for finite values; a NaN stays a
// quiet NaN) and read back widened exactly, a 16-bit shift. Both backends store the same bits for
// the same value.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace shardlm::cache_bf16 {

SHARDLM_HD inline uint16_t round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

SHARDLM_HD inline float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace shardlm::cache_bf16
