// The round both tensor-core MLA kernels walk (prefill_latent_attention_mma.cu: a tile of a
// prefill chunk's (token, head) pairs; decode_latent_attention_mma.cu: a decode token's heads,
// a position partition a block): 16 query rows against 32 cached positions, scored over every
// kv_lora + rope dim and folded into the rows' online softmax and weighted sums. See
// prefill_latent_attention_mma.h for the scheme and the numerics, mma_bf16.cuh for the fragment
// layouts.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "bf16_bits.h"
#include "cuda/attention_util.cuh"
#include "cuda/mma_bf16.cuh"
#include "cuda/mma_softmax.cuh"
#include "cuda/mma_stage.cuh"
#include "kv_cache_format.h"

namespace shardlm::cuda::detail::latent_mma {

constexpr int kRows = 16;  // query rows a block: (token, head) pairs
constexpr int kWarps = 4;
constexpr int kBN = 32;  // positions a round: a warp scores 8 of them
constexpr int kMaxLora = 512, kMaxRope = 64;
constexpr int kMaxDt = kMaxLora / 8 / kWarps;  // value n-tiles a warp accumulates
constexpr float kLog2e = 1.4426950408889634f;

// The shared memory geometry for kv_lora L and rope R: the query and key rows hold the latent
// part padded to LP = L rounded up to 16, then the rope part padded to RP; rows padded by 8
// elements (16 bytes) so fragment loads hit 32 banks. Then the values transposed [LP][kBN + 8]
// and the round's scores [kRows][kBN + 4] in fp32.
struct Geometry {
  int lp, rp, qk, qs, vs = kBN + 8, ss = kBN + 4;
  __host__ __device__ Geometry(int L, int R)
      : lp((L + 15) / 16 * 16), rp((R + 15) / 16 * 16), qk(lp + rp), qs(qk + 8) {}
  __host__ __device__ size_t bytes() const {
    return sizeof(uint16_t) * (size_t(kRows) * qs + size_t(kBN) * qs + size_t(lp) * vs) +
           sizeof(float) * size_t(kRows) * ss;
  }
};

__device__ inline uint32_t ld_pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A block's view of the round: its shared memory carved by the geometry, the cache and its
// format, and this lane's place in the warp tiles (g = lane / 4, c = lane % 4).
struct Round {
  Geometry geo;
  int L, R;
  uint16_t* sq;    // queries [kRows][qs]
  uint16_t* sk;    // keys [kBN][qs]: whole rows
  uint16_t* sv;    // values transposed: sv[d * vs + j] is latent dim d of position j
  float* ss;       // the round's scores [kRows][ss]
  int64_t* slots;  // [kBN] the round's cache slots (static shared memory of the kernel)
  const void* cache;
  KvFormat fmt;
  int64_t block_size;
  const int32_t* bt;  // the sequence's block table
  bool vec;           // L and R multiples of 8 and the cache 16-byte aligned: staged 8 dims at a time
  int warp, g, c;

  __device__ Round(int L_, int R_, uint16_t* smem, int64_t* slots_, const void* cache_, KvFormat fmt_,
                   int64_t block_size_, const int32_t* bt_, bool vec_)
      : geo(L_, R_),
        L(L_),
        R(R_),
        slots(slots_),
        cache(cache_),
        fmt(fmt_),
        block_size(block_size_),
        bt(bt_),
        vec(vec_) {
    sq = smem;
    sk = sq + kRows * geo.qs;
    sv = sk + kBN * geo.qs;
    ss = reinterpret_cast<float*>(sv + geo.lp * geo.vs);
    const int lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    g = lane >> 2;
    c = lane & 3;
  }

  // The value n-tiles this warp accumulates: [dt0, dt0 + dtw) of dtiles.
  __device__ int dtiles() const { return geo.lp / 8; }
  __device__ int dtw() const { return (dtiles() + kWarps - 1) / kWarps; }
  __device__ int dt0() const { return warp * dtw(); }

  // The fp8 cache's one row scale (1 otherwise), which the kernels apply to the scores and outputs.
  __device__ float row_scale() const { return fmt.elem == KvElem::FP8 ? fmt.k_scale : 1.0f; }

  // Query row r from (token, head) th = row_of(r) (th < 0: a row of zeros), in bf16, the latent
  // part then the rope part as the keys hold them. The first round's barrier publishes them.
  template <typename RowOf>
  __device__ void stage_queries(const float* q_latent, const float* q_rope, RowOf row_of) const {
    for (int i = threadIdx.x; i < kRows * geo.qk; i += blockDim.x) {
      const int r = i / geo.qk, d = i - r * geo.qk;
      const int64_t th = row_of(r);
      float x = 0.0f;
      if (th >= 0) {
        if (d < L) {
          x = q_latent[th * L + d];
        } else if (d >= geo.lp && d - geo.lp < R) {
          x = q_rope[th * R + (d - geo.lp)];
        }
      }
      sq[r * geo.qs + d] = bf16_bits::from_f32(x);
    }
  }

  // Folds positions [base, base + kBN) into the rows' state (m in base 2, this lane's share of
  // the sums l, the output tiles o): position p of row i counts when lo[i] <= p <= hi[i]; no
  // position past `last` is read (they stage as zeros). Every thread of the block calls it.
  __device__ void fold(int base, int last, const int (&lo)[2], const int (&hi)[2], float score_scale, float (&m)[2],
                       float (&l)[2], float (&o)[kMaxDt][4]) const {
    // The cache slots of the round's positions, -1 past `last` (never read: zeros). Written before
    // the barrier that opens the round: the last round's staging has read them.
    if (threadIdx.x < kBN) {
      const int p = base + static_cast<int>(threadIdx.x);
      slots[threadIdx.x] = p <= last ? cache_slot(bt, p, block_size) : -1;
    }
    __syncthreads();  // the queries and slots are staged; the last round's rows and scores are read
    stage_rows();
    __syncthreads();

    // Scores of the 16 rows at positions [base + 8 warp, base + 8 warp + 8), over every dim.
    float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int ksteps = geo.qk / 16;
    for (int ks = 0; ks < ksteps; ++ks) {
      const uint16_t* qa = sq + g * geo.qs + ks * 16 + 2 * c;
      const uint32_t a[4] = {ld_pair(qa), ld_pair(qa + 8 * geo.qs), ld_pair(qa + 8), ld_pair(qa + 8 * geo.qs + 8)};
      const uint16_t* kb = sk + (warp * 8 + g) * geo.qs + ks * 16 + 2 * c;
      const uint32_t b[2] = {ld_pair(kb), ld_pair(kb + 8)};
      mma_bf16_16816(sacc, a, b);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      ss[g * geo.ss + warp * 8 + 2 * c + e] = sacc[e];
      ss[(g + 8) * geo.ss + warp * 8 + 2 * c + e] = sacc[2 + e];
    }
    __syncthreads();

    // Every warp: the round's scores of its rows g, g + 8 at the columns its A fragments hold
    // (s[nt] as an accumulator tile of positions [base + 8 nt, base + 8 nt + 8)), the online
    // softmax, then its value dims.
    float s[kBN / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[nt][e] = ss[g * geo.ss + nt * 8 + 2 * c + e];
        s[nt][2 + e] = ss[(g + 8) * geo.ss + nt * 8 + 2 * c + e];
      }
    }
    mma_softmax_round(s, base, lo, hi, score_scale, m, l, o);
    const int dt_first = dt0(), dt_n = dtw(), dt_all = dtiles();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[4];
      mma_weights_fragment(s, kk, a);
#pragma unroll
      for (int k = 0; k < kMaxDt; ++k) {
        const int dt = dt_first + k;
        if (k >= dt_n || dt >= dt_all) break;  // the same in every lane
        const uint16_t* vb = sv + (dt * 8 + g) * geo.vs + kk * 16 + 2 * c;
        const uint32_t b[2] = {ld_pair(vb), ld_pair(vb + 8)};
        mma_bf16_16816(o[k], a, b);
      }
    }
  }

 private:
  // The round's rows into sk (the key: the whole row) and sv (the value: its latent part,
  // transposed). Dim d of a staged row is cache column col(d): the latent part, its padding
  // (none: zeros), the rope part, its padding; the value is zero in its padding.
  __device__ void stage_rows() const {
    const int row = L + R;
    auto col = [&](int d) { return d < L ? d : (d >= geo.lp && d - geo.lp < R ? L + d - geo.lp : -1); };
    if (vec) {  // 8 dims a chunk (a chunk never straddles a part), several chunks' loads in flight
                // per thread (mma_stage.cuh). Chunk i is position j = i % kBN's dims from d =
                // i / kBN * 8: a warp takes one chunk of every position, so that its transposed
                // value stores (position j at sv[(d + e) * vs + j]) fall in 16 consecutive words.
                // Taking a row's chunks in turn instead, all 32 lanes' stores fell in one bank
                // (8 rows of vs are 160 words).
      const void* const sides[1] = {cache};
      auto off = [&](int i) -> int64_t {
        const int j = i % kBN, cd = col(i / kBN * 8);
        return slots[j] >= 0 && cd >= 0 ? slots[j] * row + cd : -1;
      };
      auto put = [&](int i, const Bf16x8(&x)[1]) {
        const int j = i % kBN, d = i / kBN * 8;
        store8(sk + j * geo.qs + d, x[0]);
        if (d < geo.lp) {
#pragma unroll
          for (int e = 0; e < 8; ++e) sv[(d + e) * geo.vs + j] = staged_at(x[0], e);
        }
      };
      stage8_chunks<1>(fmt.elem, sides, kBN * (geo.qk / 8), off, put);
    } else {
      for (int i = threadIdx.x; i < kBN * geo.qk; i += blockDim.x) {
        const int j = i / geo.qk, d = i - j * geo.qk, cd = col(d);
        uint16_t x = 0;
        if (slots[j] >= 0 && cd >= 0) x = stage1(cache, slots[j] * row + cd, fmt.elem);
        sk[j * geo.qs + d] = x;
        if (d < geo.lp) sv[d * geo.vs + j] = x;
      }
    }
  }
};

// Whether a launch may stage 8 dims at a time.
inline bool staged_by_vectors(int64_t L, int64_t R, const void* cache) {
  return L % 8 == 0 && R % 8 == 0 && reinterpret_cast<uintptr_t>(cache) % 16 == 0;
}

}  // namespace shardlm::cuda::detail::latent_mma
