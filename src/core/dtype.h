// Element types found in checkpoints and used by kernels, with scalar conversions.
#pragma once

#include <cstdint>
#include <string>

#include "bf16_bits.h"

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

// The kernels' bf16 conversions (kernels/bf16_bits.h): exact widening, and round-to-nearest-even
// as torch's .to(bfloat16) rounds finite values.
inline float bf16_to_f32(uint16_t h) { return bf16_bits::to_f32(h); }
inline uint16_t f32_to_bf16(float f) { return bf16_bits::from_f32(f); }

float f16_to_f32(uint16_t h);

}  // namespace shardlm
