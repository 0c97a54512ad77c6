// Element types found in checkpoints and used by kernels, with scalar conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace shardlm {

enum class DType : uint8_t { F32, BF16, F16, F8_E4M3, I32, I64, U8 };

// Size in bytes of one element.
inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F8_E4M3: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

// Names as safetensors writes them ("F32", "BF16", "F8_E4M3", ...).
const char* dtype_name(DType t);
// Parses a safetensors dtype name; returns false for names shardlm does not handle.
bool dtype_from_name(const std::string& name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN kept quiet: the same rounding torch uses for .to(bfloat16).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);

}  // namespace shardlm
