// The element types a CPU KV cache holds, and how rows are stored into it.
//
// A bf16 cache stores each fp32 value rounded to nearest even and the attention kernels widen it
// back exactly, as they load it or a round of rows at a time (cpu/attention_rows.h;
// kernels/bf16_bits.h is the rounding both backends share). So attention over a bf16 cache is,
// bit for bit, attention over an fp32 cache holding the rounded values: the cache's dtype changes
// what is stored, never how the kernels reduce it. It halves the bytes a long decode streams, and
// the memory a sequence holds.
#pragma once

#include <cstdint>
#include <cstring>

#include "bf16_bits.h"

namespace shardlm::cpu {

enum class CacheElem : uint8_t { F32, BF16 };

namespace detail {

// dst[i] = src[i] rounded, i < n.
inline void narrow_row(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits::from_f32(src[i]);
}

// Stores n fp32 values at element offset `at` of a cache of `elem`.
inline void store_row(const float* src, int64_t n, CacheElem elem, void* cache, int64_t at) {
  if (elem == CacheElem::BF16) {
    narrow_row(src, n, static_cast<uint16_t*>(cache) + at);
  } else {
    std::memcpy(static_cast<float*>(cache) + at, src, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace detail
}  // namespace shardlm::cpu
