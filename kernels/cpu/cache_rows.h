// The element types a CPU KV cache holds, and how rows are stored into it.
//
// A bf16 cache stores each fp32 value rounded to nearest even, an fp8 cache the e4m3fn code of
// value / scale (kv_cache_format.h, the rules both backends share); the attention kernels read
// them back exactly, as they load them or a round of rows at a time (cpu/attention_rows.h). So
// attention over a narrow cache is, bit for bit, attention over an fp32 cache holding the values
// read back: the cache's format changes what is stored, never how the kernels reduce it. bf16
// halves the bytes a long decode streams and the memory a sequence holds; fp8 quarters them.
#pragma once

#include <cstdint>
#include <cstring>

#include "bf16_bits.h"
#include "fp8_bits.h"
#include "kv_cache_format.h"

namespace shardlm::cpu {

using CacheElem = KvElem;

namespace detail {

// Stores n fp32 values at element offset `at` of a cache side of `elem` (scale: the side's, fp8).
inline void store_row(const float* src, int64_t n, CacheElem elem, float scale, void* cache, int64_t at) {
  if (elem == CacheElem::BF16) {
    uint16_t* dst = static_cast<uint16_t*>(cache) + at;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits::from_f32(src[i]);
  } else if (elem == CacheElem::FP8) {
    uint8_t* dst = static_cast<uint8_t*>(cache) + at;
    for (int64_t i = 0; i < n; ++i) dst[i] = fp8_bits::from_f32(src[i] / scale);
  } else {
    std::memcpy(static_cast<float*>(cache) + at, src, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace detail
}  // namespace shardlm::cpu
