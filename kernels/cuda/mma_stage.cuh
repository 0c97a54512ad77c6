// Cache rows staged as the tensor-core attention kernels take them (prefill_attention_mma.cu,
// prefill_latent_attention_mma.cu): bf16 bits in shared memory. A bf16 cache's values go as they
// are, an fp8 cache's codes as their unscaled values (exact in bf16; the kernels apply the scale
// in fp32), an fp32 cache's values rounded to nearest even.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "bf16_bits.h"
#include "fp8_bits.h"
#include "kv_cache_format.h"

namespace shardlm::cuda::detail {

// Element i of a cache side as staged.
__device__ inline uint16_t stage1(const void* side, int64_t i, KvElem elem) {
  if (elem == KvElem::BF16) return static_cast<const uint16_t*>(side)[i];
  if (elem == KvElem::FP8) return bf16_bits::from_f32(fp8_bits::to_f32(static_cast<const uint8_t*>(side)[i]));
  return bf16_bits::from_f32(static_cast<const float*>(side)[i]);
}

// Eight staged elements: bf16 bits, two to a word (the lower element in the low half).
struct Bf16x8 {
  uint32_t w[4];
};

// n words from p, aligned to 4 n bytes: one vector load on the device.
template <int N>
__device__ inline void load_words(const void* p, uint32_t (&w)[N]) {
  static_assert(N == 2 || N == 4, "8- or 16-byte loads");
#if defined(__CUDA_ARCH__)
  if constexpr (N == 4) {
    const uint4 v = *static_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
    const uint2 v = *static_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  }
#else
  std::memcpy(w, p, sizeof w);
#endif
}

__device__ inline uint32_t pack_bits(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
__device__ inline uint16_t fp8_staged(uint32_t word, int byte) {
  return bf16_bits::from_f32(fp8_bits::to_f32(static_cast<uint8_t>(word >> (8 * byte))));
}
__device__ inline uint16_t fp32_staged(uint32_t bits) {
  return bf16_bits::from_f32(__int_as_float(static_cast<int>(bits)));
}

// Elements [i, i + 8) of a cache side as staged, in 16-byte loads (one 8-byte load for fp8): i a
// multiple of 8 and the side 16-byte aligned. The same bits as stage1 on each element.
__device__ inline Bf16x8 stage8(const void* side, int64_t i, KvElem elem) {
  Bf16x8 out;
  if (elem == KvElem::BF16) {
    load_words(static_cast<const uint16_t*>(side) + i, out.w);
  } else if (elem == KvElem::FP8) {
    uint32_t codes[2];
    load_words(static_cast<const uint8_t*>(side) + i, codes);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      out.w[k] = pack_bits(fp8_staged(codes[k / 2], 2 * (k % 2)), fp8_staged(codes[k / 2], 2 * (k % 2) + 1));
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t x[4];
      load_words(static_cast<const float*>(side) + i + 4 * h, x);
      out.w[2 * h] = pack_bits(fp32_staged(x[0]), fp32_staged(x[1]));
      out.w[2 * h + 1] = pack_bits(fp32_staged(x[2]), fp32_staged(x[3]));
    }
  }
  return out;
}

// Element k of eight staged ones.
__device__ inline uint16_t staged_at(const Bf16x8& x, int k) {
  return static_cast<uint16_t>(x.w[k / 2] >> (16 * (k % 2)));
}

// Stores 8 staged elements at p (16-byte aligned shared memory): one vector store on the device.
__device__ inline void store8(uint16_t* p, const Bf16x8& x) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(x.w[0], x.w[1], x.w[2], x.w[3]);
#else
  std::memcpy(p, x.w, sizeof x.w);
#endif
}

}  // namespace shardlm::cuda::detail
