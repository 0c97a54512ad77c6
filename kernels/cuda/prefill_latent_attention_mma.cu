// See prefill_latent_attention_mma.h for the scheme; mma_bf16.cuh for the fragment layouts.
#include "cuda/prefill_latent_attention_mma.h"

#include <cstdint>

#include "bf16_bits.h"
#include "cuda/attention_util.cuh"
#include "cuda/mma_bf16.cuh"
#include "cuda/mma_softmax.cuh"
#include "cuda/mma_stage.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kRows = 16;  // (token, head) pairs a block
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

// grid: tiles; block: kWarps warps. Tile b: pairs [r0, r0 + kRows) of the run of n tokens from t0,
// pair i being token t0 + i / n_heads, head i % n_heads. vec: L and R multiples of 8 and the cache
// 16-byte aligned (staged 8 dims at a time).
__global__ void __launch_bounds__(kWarps * 32)
    prefill_latent_attention_mma_kernel(const float* q_latent, const float* q_rope, int n_heads, int L, int R,
                                        const void* cache, KvFormat fmt, int64_t block_size, const int32_t* blocks,
                                        const int32_t* table_start, const int32_t* pos, float scale,
                                        const int32_t* tiles, bool vec, float* out) {
  const Geometry geo(L, R);
  extern __shared__ __align__(16) uint16_t smem_mla[];
  uint16_t* sq = smem_mla;
  uint16_t* sk = sq + kRows * geo.qs;
  uint16_t* sv = sk + kBN * geo.qs;  // sv[d * geo.vs + j]: latent dim d of position j
  float* ss = reinterpret_cast<float*>(sv + geo.lp * geo.vs);
  const int64_t t0 = tiles[3 * blockIdx.x];
  const int n = tiles[3 * blockIdx.x + 1], r0 = tiles[3 * blockIdx.x + 2];
  const int pairs = n * n_heads;
  const int32_t* bt = blocks + table_start[t0];
  const int row = L + R, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;

  // The last position any pair of the tile attends to (all start at 0: no window for MLA).
  int kv_hi = -1;
  const int last = r0 + kRows - 1 < pairs - 1 ? r0 + kRows - 1 : pairs - 1;
  for (int tok = r0 / n_heads; tok <= last / n_heads; ++tok) kv_hi = pos[t0 + tok] > kv_hi ? pos[t0 + tok] : kv_hi;
  // This lane's rows g and g + 8 attend to [0, row_hi]: -1 past the tile or for a padding token.
  const int row_lo[2] = {0, 0};
  int row_hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int pr = r0 + g + 8 * i;
    row_hi[i] = pr < pairs ? pos[t0 + pr / n_heads] : -1;
  }

  for (int i = threadIdx.x; i < kRows * geo.qk; i += blockDim.x) {
    const int r = i / geo.qk, d = i - r * geo.qk, pr = r0 + r;
    float x = 0.0f;
    if (pr < pairs) {
      const int64_t th = (t0 + pr / n_heads) * n_heads + pr % n_heads;  // (token, head)
      if (d < L) {
        x = q_latent[th * L + d];
      } else if (d >= geo.lp && d - geo.lp < R) {
        x = q_rope[th * R + (d - geo.lp)];
      }
    }
    sq[r * geo.qs + d] = bf16_bits::from_f32(x);
  }

  const float row_scale = fmt.elem == KvElem::FP8 ? fmt.k_scale : 1.0f;  // one scale for the whole row
  const float score_scale = scale * row_scale * kLog2e;
  const int ksteps = geo.qk / 16, dtiles = geo.lp / 8, dtw = (dtiles + kWarps - 1) / kWarps, dt0 = warp * dtw;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kMaxDt][4];
#pragma unroll
  for (int k = 0; k < kMaxDt; ++k) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;

  // The cache slots of the round's positions, -1 past the tile's last (never read: zeros). Written
  // before the barrier that opens the round: the last round's staging has read them.
  __shared__ int64_t slots[kBN];
  for (int base = 0; base <= kv_hi; base += kBN) {
    if (threadIdx.x < kBN) {
      const int p = base + static_cast<int>(threadIdx.x);
      slots[threadIdx.x] = p <= kv_hi ? detail::cache_slot(bt, p, block_size) : -1;
    }
    __syncthreads();  // the queries and slots are staged; the last round's rows and scores are read
    // Dim d of a staged row is cache column col(d): the latent part, its padding (none: zeros),
    // the rope part, its padding. The value is the latent part (zero in its padding).
    auto col = [&](int d) { return d < L ? d : (d >= geo.lp && d - geo.lp < R ? L + d - geo.lp : -1); };
    if (vec) {  // 8 dims a chunk (L and R multiples of 8: a chunk never straddles a part), several
                // chunks' loads in flight per thread (mma_stage.cuh)
      const void* const sides[1] = {cache};
      auto off = [&](int i) -> int64_t {
        const int j = i / (geo.qk / 8), cd = col((i - j * (geo.qk / 8)) * 8);
        return slots[j] >= 0 && cd >= 0 ? slots[j] * row + cd : -1;
      };
      auto put = [&](int i, const detail::Bf16x8(&x)[1]) {
        const int j = i / (geo.qk / 8), d = (i - j * (geo.qk / 8)) * 8;
        detail::store8(sk + j * geo.qs + d, x[0]);
        if (d < geo.lp) {
#pragma unroll
          for (int e = 0; e < 8; ++e) sv[(d + e) * geo.vs + j] = detail::staged_at(x[0], e);
        }
      };
      detail::stage8_chunks<1>(fmt.elem, sides, kBN * (geo.qk / 8), off, put);
    } else {
      for (int i = threadIdx.x; i < kBN * geo.qk; i += blockDim.x) {
        const int j = i / geo.qk, d = i - j * geo.qk, cd = col(d);
        uint16_t x = 0;
        if (slots[j] >= 0 && cd >= 0) x = detail::stage1(cache, slots[j] * row + cd, fmt.elem);
        sk[j * geo.qs + d] = x;
        if (d < geo.lp) sv[d * geo.vs + j] = x;
      }
    }
    __syncthreads();

    // Scores of the 16 rows at positions [base + 8 warp, base + 8 warp + 8), over every dim.
    float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int ks = 0; ks < ksteps; ++ks) {
      const uint16_t* qa = sq + g * geo.qs + ks * 16 + 2 * c;
      const uint32_t a[4] = {ld_pair(qa), ld_pair(qa + 8 * geo.qs), ld_pair(qa + 8), ld_pair(qa + 8 * geo.qs + 8)};
      const uint16_t* kb = sk + (warp * 8 + g) * geo.qs + ks * 16 + 2 * c;
      const uint32_t b[2] = {ld_pair(kb), ld_pair(kb + 8)};
      detail::mma_bf16_16816(sacc, a, b);
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
    detail::mma_softmax_round(s, base, row_lo, row_hi, score_scale, m, l, o);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[4];
      detail::mma_weights_fragment(s, kk, a);
#pragma unroll
      for (int k = 0; k < kMaxDt; ++k) {
        const int dt = dt0 + k;
        if (k >= dtw || dt >= dtiles) break;  // the same in every lane
        const uint16_t* vb = sv + (dt * 8 + g) * geo.vs + kk * 16 + 2 * c;
        const uint32_t b[2] = {ld_pair(vb), ld_pair(vb + 8)};
        detail::mma_bf16_16816(o[k], a, b);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float f = detail::mma_output_factor(l[i], row_scale);
    const int pr = r0 + g + 8 * i;
    if (pr >= pairs) continue;
    float* dst = out + ((t0 + pr / n_heads) * n_heads + pr % n_heads) * L;
#pragma unroll
    for (int k = 0; k < kMaxDt; ++k) {
      const int dt = dt0 + k;
      if (k >= dtw || dt >= dtiles) break;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = dt * 8 + 2 * c + e;
        if (d < L) dst[d] = o[k][2 * i + e] * f;
      }
    }
  }
}

}  // namespace

std::vector<int32_t> prefill_latent_attention_mma_tiles(const int32_t* table_start, int64_t T, int64_t n_heads,
                                                        bool singles) {
  std::vector<int32_t> tiles;
  for (int64_t t = 0; t < T;) {
    int64_t n = 1;
    while (t + n < T && table_start[t + n] == table_start[t]) ++n;
    for (int64_t r = 0; r < n * n_heads && (singles || n > 1); r += kRows) {
      tiles.push_back(static_cast<int32_t>(t));
      tiles.push_back(static_cast<int32_t>(n));
      tiles.push_back(static_cast<int32_t>(r));
    }
    t += n;
  }
  return tiles;
}

void prefill_latent_attention_mma(const float* q_latent, const float* q_rope, int64_t n_heads, int64_t kv_lora,
                                  int64_t rope_dim, const void* cache, KvFormat cache_fmt, int64_t block_size,
                                  const int32_t* blocks, const int32_t* table_start, const int32_t* pos, float scale,
                                  const int32_t* tiles, int64_t n_tiles, float* out, cudaStream_t stream) {
  if (n_tiles <= 0 || n_heads <= 0 || kv_lora <= 0 || kv_lora > kMaxLora || rope_dim < 0 || rope_dim > kMaxRope) return;
  const Geometry geo(static_cast<int>(kv_lora), static_cast<int>(rope_dim));
  const size_t bytes = geo.bytes();
  const bool vec = kv_lora % 8 == 0 && rope_dim % 8 == 0 && reinterpret_cast<uintptr_t>(cache) % 16 == 0;
  if (bytes > 48 * 1024) {  // opt in to the largest geometry once (a failure shows at launch)
    static const cudaError_t opted =
        cudaFuncSetAttribute(prefill_latent_attention_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(Geometry(kMaxLora, kMaxRope).bytes()));
    (void)opted;
  }
  prefill_latent_attention_mma_kernel<<<static_cast<unsigned>(n_tiles), kWarps * 32, bytes, stream>>>(
      q_latent, q_rope, static_cast<int>(n_heads), static_cast<int>(kv_lora), static_cast<int>(rope_dim), cache,
      cache_fmt, block_size, blocks, table_start, pos, scale, tiles, vec, out);
}

}  // namespace shardlm::cuda
