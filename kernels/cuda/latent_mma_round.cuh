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
#include "cuda/ldmatrix.cuh"
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
// A block's shared memory at DeepSeek-V3's 512 + 64 dims is about 58 KB, so 3 blocks fit an SM's
// 227 KB; their registers then must fit 168 a thread.
constexpr int kBlocksPerSm = 3;

// The shared memory geometry for kv_lora L and rope R: the query and key rows hold the latent
// part padded to LP = L rounded up to 16, then the rope part padded to RP; rows padded by 8
// elements (16 bytes, a row pitch of 4 banks mod 32) so each 8-row phase of an ldmatrix hits 32
// banks. Then the round's scores [kRows][kBN + 4] in fp32. The values are the keys' latent part,
// read in place by transposing loads (ldmatrix.cuh).
struct Geometry {
  int lp, rp, qk, qs, ss = kBN + 4;
  __host__ __device__ Geometry(int L, int R)
      : lp((L + 15) / 16 * 16), rp((R + 15) / 16 * 16), qk(lp + rp), qs(qk + 8) {}
  __host__ __device__ size_t bytes() const {
    return sizeof(uint16_t) * (size_t(kRows) * qs + size_t(kBN) * qs) + sizeof(float) * size_t(kRows) * ss;
  }
};

// A block's view of the round: its shared memory carved by the geometry, the cache and its
// format, and this lane's place in the warp tiles (g = lane / 4, c = lane % 4).
struct Round {
  Geometry geo;
  int L, R;
  uint16_t* sq;    // queries [kRows][qs]
  uint16_t* sk;    // keys [kBN][qs]: whole rows, their first lp dims the values
  float* ss;       // the round's scores [kRows][ss]
  int64_t* slots;  // [kBN] the round's cache slots (static shared memory of the kernel)
  const void* cache;
  KvFormat fmt;
  int64_t block_size;
  const int32_t* bt;  // the sequence's block table
  bool vec;           // L and R multiples of 8 and the cache 16-byte aligned: staged 8 dims at a time
  int warp, g, c;
  int lrow, lcol;  // this lane's row and column in the ldmatrix.x4 of a 16 x 16 tile (below)

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
    ss = reinterpret_cast<float*>(sk + kBN * geo.qs);
    const int lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    g = lane >> 2;
    c = lane & 3;
    // Matrix m = lane / 8 of a 16 x 16 tile: rows 8 (m % 2).., columns 8 (m / 2)..; as A, its
    // registers are the m16n8k16 A fragment; transposed, a [k][n] tile's B fragments for n-tiles
    // 0 (registers 0, 1) and 1 (2, 3).
    lrow = (lane & 7) + 8 * ((lane >> 3) & 1);
    lcol = 8 * (lane >> 4);
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

    // Scores of the 16 rows at positions [base + 8 warp, base + 8 warp + 8), over every dim. A
    // k-step pair's key fragments are one ldmatrix.x4 of the warp's 8 rows: matrix m is dims
    // 8 m.. of the pair's 32 (the last step of an odd count loads its 16 dims twice).
    float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int ksteps = geo.qk / 16;
    const uint16_t* qa = sq + lrow * geo.qs + lcol;
    const uint16_t* kb = sk + (warp * 8 + (threadIdx.x & 7)) * geo.qs + 8 * ((threadIdx.x >> 3) & 3);
    for (int ks = 0; ks < ksteps; ks += 2) {
      const bool two = ks + 1 < ksteps;  // the same in every lane
      uint32_t b[4];
      ldmatrix_x4(b, kb + ks * 16 - (two || (threadIdx.x & 16) == 0 ? 0 : 16));
      uint32_t a[4];
      ldmatrix_x4(a, qa + ks * 16);
      mma_bf16_16816(sacc, a, {b[0], b[1]});
      if (two) {
        ldmatrix_x4(a, qa + ks * 16 + 16);
        mma_bf16_16816(sacc, a, {b[2], b[3]});
      }
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
    // The values of positions [16 kk, 16 kk + 16) at an n-tile pair: one transposing ldmatrix.x4
    // of the key rows (a lone last n-tile loads its 8 dims twice).
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[4];
      mma_weights_fragment(s, kk, a);
      const uint16_t* vb = sk + (kk * 16 + lrow) * geo.qs + dt_first * 8;
#pragma unroll
      for (int k = 0; k < kMaxDt; k += 2) {
        const int dt = dt_first + k;
        if (k >= dt_n || dt >= dt_all) break;  // the same in every lane
        const bool two = k + 1 < dt_n && dt + 1 < dt_all;
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + k * 8 + (two ? lcol : 0));
        mma_bf16_16816(o[k], a, {b[0], b[1]});
        if (two) mma_bf16_16816(o[k + 1], a, {b[2], b[3]});
      }
    }
  }

 private:
  // The round's rows into sk. Dim d of a staged row is cache column col(d): the latent part, its
  // padding (none: zeros), the rope part, its padding.
  __device__ void stage_rows() const {
    const int row = L + R;
    auto col = [&](int d) { return d < L ? d : (d >= geo.lp && d - geo.lp < R ? L + d - geo.lp : -1); };
    if (vec) {  // 8 dims a chunk (a chunk never straddles a part), several chunks' loads in flight
                // per thread (mma_stage.cuh). Chunk i is position j = i % kBN's dims from d =
                // i / kBN * 8: a warp's 16-byte stores go to 32 rows 4 banks apart.
      const void* const sides[1] = {cache};
      auto off = [&](int i) -> int64_t {
        const int j = i % kBN, cd = col(i / kBN * 8);
        return slots[j] >= 0 && cd >= 0 ? slots[j] * row + cd : -1;
      };
      if (fmt.elem == KvElem::BF16) {
        auto dst = [&](int i, int) { return sk + (i % kBN) * geo.qs + i / kBN * 8; };
        stage8_chunks_async<1>(sides, kBN * (geo.qk / 8), off, dst);
      } else {
        auto put = [&](int i, const Bf16x8(&x)[1]) {
          const int j = i % kBN, d = i / kBN * 8;
          store8(sk + j * geo.qs + d, x[0]);
        };
        stage8_chunks<1>(fmt.elem, sides, kBN * (geo.qk / 8), off, put);
      }
    } else {
      for (int i = threadIdx.x; i < kBN * geo.qk; i += blockDim.x) {
        const int j = i / geo.qk, d = i - j * geo.qk, cd = col(d);
        uint16_t x = 0;
        if (slots[j] >= 0 && cd >= 0) x = stage1(cache, slots[j] * row + cd, fmt.elem);
        sk[j * geo.qs + d] = x;
      }
    }
  }
};

// Whether a launch may stage 8 dims at a time.
inline bool staged_by_vectors(int64_t L, int64_t R, const void* cache) {
  return L % 8 == 0 && R % 8 == 0 && reinterpret_cast<uintptr_t>(cache) % 16 == 0;
}

}  // namespace shardlm::cuda::detail::latent_mma
