// The element types a CPU KV cache holds, and the row conversions between them and fp32.
//
// A bf16 cache stores each fp32 value rounded to nearest even and the attention kernels widen it
// back exactly (kernels/cache_bf16.h, shared with the CUDA kernels). So attention over a bf16
// cache is, bit for bit, attention over an fp32 cache holding the rounded values: the cache's
// dtype changes what is stored, never how the kernels reduce it. It halves the bytes a long
// decode streams, and the memory a sequence holds.
#pragma once

#include <cstdint>
#include <cstring>

#include "cache_bf16.h"

namespace shardlm::cpu {

enum class CacheElem : uint8_t { F32, BF16 };

inline int64_t cache_elem_bytes(CacheElem e) { return e == CacheElem::BF16 ? 2 : 4; }

namespace detail {

// dst[i] = src[i] rounded, i < n.
inline void narrow_row(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = cache_bf16::round(src[i]);
}

// dst[i] = src[i] widened, i < n: sixteen at a time in one vector shift.
inline void widen_row(const uint16_t* src, int64_t n, float* dst) {
  typedef uint16_t v16h __attribute__((vector_size(32)));
  typedef uint32_t v16u __attribute__((vector_size(64)));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v16h h;
    std::memcpy(&h, src + i, sizeof h);
    const v16u w = __builtin_convertvector(h, v16u) << 16;
    std::memcpy(dst + i, &w, sizeof w);
  }
  for (; i < n; ++i) dst[i] = cache_bf16::widen(src[i]);
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
