#include "core/dtype.h"

#include <cmath>

namespace shardlm {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
  static const struct { const char* name; DType t; } kTable[] = {
      {"F32", DType::F32},  {"BF16", DType::BF16}, {"F16", DType::F16},   {"F8_E4M3", DType::F8_E4M3},
      {"I32", DType::I32},  {"I64", DType::I64},   {"U8", DType::U8},
  };
  for (const auto& e : kTable) {
    if (name == e.name) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

}  // namespace shardlm
