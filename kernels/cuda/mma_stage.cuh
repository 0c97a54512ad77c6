// Cache rows staged as the tensor-core attention kernels take them (prefill_attention_mma.cu,
// prefill_latent_attention_mma.cu): bf16 bits in shared memory. A bf16 cache's values go as they
// are, an fp8 cache's codes as their unscaled values (exact in bf16; the kernels apply the scale
// in fp32), an fp32 cache's values rounded to nearest even.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/convert_pairs.cuh"
#include "cuda/cp_async.cuh"
#include "kv_cache_format.h"

namespace shardlm::cuda::detail {

// Element i of a cache side as staged.
__device__ inline uint16_t stage1(const void* side, int64_t i, KvElem elem) {
  if (elem == KvElem::BF16) return static_cast<const uint16_t*>(side)[i];
  if (elem == KvElem::FP8) return f32_to_bf16(e4m3_to_f32(static_cast<const uint8_t*>(side)[i]));
  return f32_to_bf16(static_cast<const float*>(side)[i]);
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

// Codes 2k and 2k + 1 of a word pair as staged, a bf16 pair (exact: every e4m3 value is a bf16).
__device__ inline uint32_t fp8_pair_staged(const uint32_t (&w)[2], int k) {
  float lo, hi;
  e4m3x2_to_f32(w[k / 2] >> (16 * (k % 2)), lo, hi);
  return f32x2_to_bf16x2(lo, hi);
}

// Elements [i, i + 8) of a cache side of format E as they are stored (raw8: one 16-byte load, one
// 8-byte load for fp8, two 16-byte loads for fp32; i a multiple of 8 and the side 16-byte aligned),
// and the same as staged (convert8: the bits of stage1 on each element).
template <KvElem E>
constexpr int kRawWords = E == KvElem::BF16  ? 4
                          : E == KvElem::FP8 ? 2
                                             : 8;
template <KvElem E>
__device__ inline void raw8(const void* side, int64_t i, uint32_t (&w)[kRawWords<E>]) {
  if constexpr (E == KvElem::BF16) {
    load_words(static_cast<const uint16_t*>(side) + i, w);
  } else if constexpr (E == KvElem::FP8) {
    load_words(static_cast<const uint8_t*>(side) + i, w);
  } else {
    uint32_t lo[4], hi[4];
    load_words(static_cast<const float*>(side) + i, lo);
    load_words(static_cast<const float*>(side) + i + 4, hi);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = lo[k], w[4 + k] = hi[k];
  }
}
template <KvElem E>
__device__ inline Bf16x8 convert8(const uint32_t (&w)[kRawWords<E>]) {
  Bf16x8 out;
  if constexpr (E == KvElem::BF16) {
#pragma unroll
    for (int k = 0; k < 4; ++k) out.w[k] = w[k];
  } else if constexpr (E == KvElem::FP8) {
#pragma unroll
    for (int k = 0; k < 4; ++k) out.w[k] = fp8_pair_staged(w, k);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) out.w[k] = f32x2_to_bf16x2(__uint_as_float(w[2 * k]), __uint_as_float(w[2 * k + 1]));
  }
  return out;
}

// Stages `items` chunks of 8 elements of each of Sides cache sides of format E: chunk i from
// element off(i) of every side (off < 0: zeros, nothing read), handed to put(i, chunks[Sides]).
// Each pass issues the loads of several chunks (about 32 registers of them) before it converts or
// hands over any: with the stores into shared memory between them, the compiler would otherwise
// wait for each chunk's load in turn (one memory latency per chunk: the prefill attention kernels
// ran at 1 to 2% of the H200's bf16 peak so).
template <KvElem E, int Sides, typename Off, typename Put>
__device__ inline void stage8_chunks(const void* const (&side)[Sides], int items, Off off, Put put) {
  constexpr int W = kRawWords<E>;
  constexpr int kInFlight = 32 / (W * Sides) > 0 ? 32 / (W * Sides) : 1;
  const int step = static_cast<int>(blockDim.x);
  for (int i0 = static_cast<int>(threadIdx.x); i0 < items; i0 += kInFlight * step) {
    uint32_t w[kInFlight][Sides][W];
#pragma unroll
    for (int b = 0; b < kInFlight; ++b) {
      const int i = i0 + b * step;
      const int64_t o = i < items ? off(i) : -1;
#pragma unroll
      for (int s = 0; s < Sides; ++s) {
        if (o >= 0) {
          raw8<E>(side[s], o, w[b][s]);
        } else {
#pragma unroll
          for (int k = 0; k < W; ++k) w[b][s][k] = 0u;  // staged as +0
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kInFlight; ++b) {
      const int i = i0 + b * step;
      if (i < items) {
        Bf16x8 x[Sides];
#pragma unroll
        for (int s = 0; s < Sides; ++s) x[s] = convert8<E>(w[b][s]);
        put(i, x);
      }
    }
  }
}

// stage8_chunks for a cache of format elem.
template <int Sides, typename Off, typename Put>
__device__ inline void stage8_chunks(KvElem elem, const void* const (&side)[Sides], int items, Off off, Put put) {
  if (elem == KvElem::BF16) {
    stage8_chunks<KvElem::BF16, Sides>(side, items, off, put);
  } else if (elem == KvElem::FP8) {
    stage8_chunks<KvElem::FP8, Sides>(side, items, off, put);
  } else {
    stage8_chunks<KvElem::F32, Sides>(side, items, off, put);
  }
}

// stage8_chunks for a bf16 cache, whose chunks need no conversion: each thread copies its chunks
// by cp.async (chunk i of side s to dst(i, s), 16-byte aligned shared memory; off as above) and
// waits for them. No register holds a chunk, so all of a thread's loads are in flight at once
// where stage8_chunks issues kInFlight at a time (4 chunks of K and V, 8 of an MLA row): at 128
// dims and 64 positions a round, 16 a thread, one memory latency a round instead of four. A
// barrier then makes them the block's.
template <int Sides, typename Off, typename Dst>
__device__ inline void stage8_chunks_async(const void* const (&side)[Sides], int items, Off off, Dst dst) {
  for (int i = static_cast<int>(threadIdx.x); i < items; i += static_cast<int>(blockDim.x)) {
    const int64_t o = off(i);
#pragma unroll
    for (int s = 0; s < Sides; ++s)
      copy16_async(dst(i, s), o >= 0 ? static_cast<const uint16_t*>(side[s]) + o : side[s], o >= 0);
  }
  commit_async();
  wait_async<0>();
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
