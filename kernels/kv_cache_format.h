// What a KV cache side holds, one definition for the CPU and the CUDA kernels:
//  - F32: the values;
//  - BF16: each value rounded to nearest even (bf16_bits.h), widened exactly on read;
//  - FP8: e4m3fn codes of value / scale, rounded to nearest even and saturated at +-448
//    (fp8_bits.h); a code c reads as fp8_bits::to_f32(c) * scale, one fp32 product. The scale is
//    per layer and side, as vLLM's k_scale / v_scale: 1 unless the checkpoint gives one.
// Every backend stores the same bits for the same value and reads them back as the same fp32
// value, so attention over a narrow cache is, bit for bit, attention over an fp32 cache holding
// the values read back: the format changes what is stored, never how the kernels reduce it.
#pragma once

#include <cstdint>

#include "bf16_bits.h"
#include "fp8_bits.h"
#include "host_device.h"

namespace shardlm {

enum class KvElem : uint8_t { F32, BF16, FP8 };

struct KvFormat {
  KvElem elem = KvElem::F32;
  float k_scale = 1.0f, v_scale = 1.0f;  // FP8 only
  SHARDLM_HD KvFormat() {}
  SHARDLM_HD KvFormat(KvElem e, float ks = 1.0f, float vs = 1.0f) : elem(e), k_scale(ks), v_scale(vs) {}
};

// Element i of a cache side of elem, as fp32 (scale: the side's, FP8 only).
SHARDLM_HD inline float kv_load(const void* side, int64_t i, KvElem elem, float scale) {
  if (elem == KvElem::BF16) return bf16_bits::to_f32(static_cast<const uint16_t*>(side)[i]);
  if (elem == KvElem::FP8) return fp8_bits::to_f32(static_cast<const uint8_t*>(side)[i]) * scale;
  return static_cast<const float*>(side)[i];
}

// Stores x at element i of a cache side of elem.
SHARDLM_HD inline void kv_store(void* side, int64_t i, float x, KvElem elem, float scale) {
  if (elem == KvElem::BF16) {
    static_cast<uint16_t*>(side)[i] = bf16_bits::from_f32(x);
  } else if (elem == KvElem::FP8) {
    static_cast<uint8_t*>(side)[i] = fp8_bits::from_f32(x / scale);
  } else {
    static_cast<float*>(side)[i] = x;
  }
}

}  // namespace shardlm
