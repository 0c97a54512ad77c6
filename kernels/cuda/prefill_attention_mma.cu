// See prefill_attention_mma.h for the scheme; mma_bf16.cuh for the fragment layouts used below.
#include "cuda/prefill_attention_mma.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "bf16_bits.h"
#include "cuda/attention_partitions.h"
#include "cuda/attention_util.cuh"
#include "cuda/ldmatrix.cuh"
#include "cuda/mma_bf16.cuh"
#include "cuda/mma_softmax.cuh"
#include "cuda/mma_stage.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kWarps = kPrefillMmaRows / 16;
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory of a block, bf16: the tile's queries [kPrefillMmaRows][HDP], the round's keys
// and values [BN][HDP] each. Rows are padded by 8 elements (16 bytes), so the 8 rows an ldmatrix
// phase reads (and a warp's 16-byte staging stores, 8 at a time) start 4 banks apart and fall in
// 32 banks. The fragments are loaded by ldmatrix.x4 (ldmatrix.cuh), the values' transposed.
template <int HDP, int BN>
struct Layout {
  static constexpr int kQ = HDP + 8, kK = HDP + 8, kV = HDP + 8;
  static constexpr size_t kBytes =
      sizeof(uint16_t) * (size_t{kPrefillMmaRows} * kQ + size_t{BN} * kK + size_t{BN} * kV);
};

// grid: (tiles, query heads); block: kWarps warps. HDP: head_dim rounded up to the instantiated
// width (the padding dims are zero in Q and K, and dropped from the output); BN: positions a round.
// vec: head_dim a multiple of 8 and both cache sides 16-byte aligned (staged 8 dims at a time).
template <int HDP, int BN>
__global__ void __launch_bounds__(kWarps * 32)
    prefill_attention_mma_kernel(const float* q, int64_t n_heads, int64_t n_kv_heads, int head_dim, const void* k_cache,
                                 const void* v_cache, KvFormat fmt, int64_t block_size, const int32_t* blocks,
                                 const int32_t* table_start, const int32_t* pos, int64_t window, float scale,
                                 const int32_t* tiles, int nh, bool vec, float* out, uint16_t* twin) {
  using L = Layout<HDP, BN>;
  extern __shared__ __align__(16) uint16_t smem_bf16[];
  uint16_t* sq = smem_bf16;
  uint16_t* sk = sq + kPrefillMmaRows * L::kQ;
  uint16_t* sv = sk + BN * L::kK;
  // Row r of the tile: token t0 + r / nh, query head h + r % nh (all of KV head kvh).
  const int64_t h = static_cast<int64_t>(blockIdx.y) * nh, kvh = h / (n_heads / n_kv_heads);
  const int64_t t0 = tiles[2 * blockIdx.x];
  const int rows = tiles[2 * blockIdx.x + 1] * nh;
  const int32_t* bt = blocks + table_start[t0];
  const int hd = head_dim, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int64_t slot_elems = n_kv_heads * hd;

  // The positions the tile attends to (the union of its tokens' [first, pos]) and the warp's.
  int kv_lo = INT_MAX, kv_hi = -1, w_lo = INT_MAX, w_hi = -1;
  for (int r = 0; r < rows; ++r) {
    const int p = pos[t0 + r / nh];
    if (p < 0) continue;
    const int lo = static_cast<int>(attention_first_position(p, window));
    kv_lo = lo < kv_lo ? lo : kv_lo;
    kv_hi = p > kv_hi ? p : kv_hi;
    if (r / 16 == warp) {
      w_lo = lo < w_lo ? lo : w_lo;
      w_hi = p > w_hi ? p : w_hi;
    }
  }
  // This lane's rows of the warp's 16: g and g + 8; an empty range (lo > hi) past the tile or for
  // a padding token.
  int row_lo[2], row_hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + 8 * i;
    const int p = r < rows ? pos[t0 + r / nh] : -1;
    row_lo[i] = p < 0 ? 1 : static_cast<int>(attention_first_position(p, window));
    row_hi[i] = p < 0 ? 0 : p;
  }

  for (int i = threadIdx.x; i < kPrefillMmaRows * HDP; i += blockDim.x) {
    const int r = i / HDP, d = i - r * HDP;
    const float x = r < rows && d < hd ? q[((t0 + r / nh) * n_heads + h + r % nh) * hd + d] : 0.0f;
    sq[r * L::kQ + d] = bf16_bits::from_f32(x);
  }

  const float score_scale = scale * (fmt.elem == KvElem::FP8 ? fmt.k_scale : 1.0f) * kLog2e;
  const int ksteps = (hd + 15) / 16, dtiles = (hd + 7) / 8;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[HDP / 8][4];
#pragma unroll
  for (int dt = 0; dt < HDP / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

  // The cache slots of the round's positions, -1 outside the tile's range (never read: zeros).
  // Written before the barrier that opens the round: the last round's staging has read them.
  __shared__ int64_t slots[BN];
  for (int base = kv_hi < 0 ? 0 : kv_lo / BN * BN; base <= kv_hi; base += BN) {
    if (threadIdx.x < BN) {
      const int p = base + static_cast<int>(threadIdx.x);
      slots[threadIdx.x] = p >= kv_lo && p <= kv_hi ? detail::cache_slot(bt, p, block_size) : -1;
    }
    __syncthreads();  // the queries and slots are staged; the last round's keys and values are read
    // Dims past head_dim are never read (zeros) either.
    if (vec) {  // 8 dims a chunk, several chunks' loads in flight per thread (mma_stage.cuh; a
                // bf16 cache's all at once, by cp.async). Chunk i is position j = i % BN's dims
                // from d = i / BN * 8 (a warp's stores go to 32 rows, 4 banks apart).
      const void* const sides[2] = {k_cache, v_cache};
      auto off = [&](int i) -> int64_t {
        const int j = i % BN, d = i / BN * 8;
        return slots[j] >= 0 && d < hd ? slots[j] * slot_elems + kvh * hd + d : -1;
      };
      if (fmt.elem == KvElem::BF16) {
        auto dst = [&](int i, int s) { return (s == 0 ? sk + (i % BN) * L::kK : sv + (i % BN) * L::kV) + i / BN * 8; };
        detail::stage8_chunks_async<2>(sides, BN * (HDP / 8), off, dst);
      } else {
        auto put = [&](int i, const detail::Bf16x8(&x)[2]) {
          const int j = i % BN, d = i / BN * 8;
          detail::store8(sk + j * L::kK + d, x[0]);
          detail::store8(sv + j * L::kV + d, x[1]);
        };
        detail::stage8_chunks<2>(fmt.elem, sides, BN * (HDP / 8), off, put);
      }
    } else {
      for (int i = threadIdx.x; i < BN * HDP; i += blockDim.x) {
        const int j = i / HDP, d = i - j * HDP;
        uint16_t kx = 0, vx = 0;
        if (slots[j] >= 0 && d < hd) {
          const int64_t off = slots[j] * slot_elems + kvh * hd + d;
          kx = detail::stage1(k_cache, off, fmt.elem);
          vx = detail::stage1(v_cache, off, fmt.elem);
        }
        sk[j * L::kK + d] = kx;
        sv[j * L::kV + d] = vx;
      }
    }
    __syncthreads();
    if (w_hi < base || w_lo > base + BN - 1) continue;  // the same for the whole warp

    // Scores: s[nt] is the warp's rows x positions [base + 8 nt, base + 8 nt + 8). Lane l names
    // row lrow, column lcol of a 16 x 16 tile to ldmatrix (matrix l / 8: rows 8 (l / 8 % 2)..,
    // columns 8 (l / 16)..): of the queries, the A fragment; of 16 key rows, the B fragments of
    // their two 8-position n-tiles; transposed, of 16 value rows, those of two 8-dim n-tiles.
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4);
    const int krow = (lane & 7) + 8 * (lane >> 4), kcol = 8 * ((lane >> 3) & 1);
    float s[BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < HDP / 16; ++ks) {
      if (ks >= ksteps) break;  // the same in every lane
      uint32_t a[4];
      detail::ldmatrix_x4(a, sq + (warp * 16 + lrow) * L::kQ + ks * 16 + lcol);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        detail::ldmatrix_x4(b, sk + (np * 16 + krow) * L::kK + ks * 16 + kcol);
        detail::mma_bf16_16816(s[2 * np], a, {b[0], b[1]});
        detail::mma_bf16_16816(s[2 * np + 1], a, {b[2], b[3]});
      }
    }

    detail::mma_softmax_round(s, base, row_lo, row_hi, score_scale, m, l, o);

    // o += P V, 16 positions at a time.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      detail::mma_weights_fragment(s, kk, a);
#pragma unroll
      for (int dt = 0; dt < HDP / 8; dt += 2) {
        if (dt >= dtiles) break;  // the same in every lane (HDP / 8 is even; a tile past head_dim adds zeros)
        uint32_t b[4];
        detail::ldmatrix_x4_trans(b, sv + (kk * 16 + lrow) * L::kV + dt * 8 + lcol);
        detail::mma_bf16_16816(o[dt], a, {b[0], b[1]});
        detail::mma_bf16_16816(o[dt + 1], a, {b[2], b[3]});
      }
    }
  }

  const float v_scale = fmt.elem == KvElem::FP8 ? fmt.v_scale : 1.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float f = detail::mma_output_factor(l[i], v_scale);
    const int r = warp * 16 + g + 8 * i;
    if (r >= rows) continue;
    const int64_t row = ((t0 + r / nh) * n_heads + h + r % nh) * hd;
#pragma unroll
    for (int dt = 0; dt < HDP / 8; ++dt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = dt * 8 + 2 * c + e;
        if (d < hd) detail::put_output(out + row, twin ? twin + row : nullptr, d, o[dt][2 * i + e] * f);
      }
    }
  }
}

template <int HDP, int BN>
void launch(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const void* k_cache,
            const void* v_cache, KvFormat fmt, int64_t block_size, const int32_t* blocks, const int32_t* table_start,
            const int32_t* pos, int64_t window, float scale, const int32_t* tiles, int64_t n_tiles, int nh, float* out,
            uint16_t* twin, cudaStream_t stream) {
  constexpr size_t bytes = Layout<HDP, BN>::kBytes;
  const bool vec = head_dim % 8 == 0 && reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;
  // Above the default (48 KiB less the kernel's static slots) the kernel must opt in, once (a
  // failure shows at launch).
  if (bytes + BN * sizeof(int64_t) > 48 * 1024) {
    static const cudaError_t opted = cudaFuncSetAttribute(
        prefill_attention_mma_kernel<HDP, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    (void)opted;
  }
  prefill_attention_mma_kernel<HDP, BN>
      <<<dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(n_heads / nh)), kWarps * 32, bytes, stream>>>(
          q, n_heads, n_kv_heads, static_cast<int>(head_dim), k_cache, v_cache, fmt, block_size, blocks, table_start,
          pos, window, scale, tiles, nh, vec, out, twin);
}

}  // namespace

PrefillMmaTiles prefill_attention_mma_tiles(const int32_t* table_start, int64_t T, int64_t group, bool singles) {
  PrefillMmaTiles p;
  // The most query heads of one KV head a tile can pack: a divisor of the group, up to the rows.
  for (int d = 1; d <= kPrefillMmaRows && d <= group; ++d)
    if (group % d == 0) p.packed_heads = d;
  const int64_t packed_tokens = kPrefillMmaRows / p.packed_heads;
  std::vector<int32_t> packed;
  for (int64_t t = 0; t < T;) {
    int64_t run = 1;
    while (t + run < T && table_start[t + run] == table_start[t]) ++run;
    for (int64_t i = 0; i < run && (singles || run > 1); i += kPrefillMmaRows) {
      const int64_t n = std::min<int64_t>(kPrefillMmaRows, run - i);
      std::vector<int32_t>& to = p.packed_heads > 1 && n <= packed_tokens ? packed : p.tiles;
      to.push_back(static_cast<int32_t>(t + i));
      to.push_back(static_cast<int32_t>(n));
    }
    t += run;
  }
  p.one_head = static_cast<int64_t>(p.tiles.size() / 2);
  p.packed = static_cast<int64_t>(packed.size() / 2);
  p.tiles.insert(p.tiles.end(), packed.begin(), packed.end());
  return p;
}

void prefill_attention_mma(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const void* k_cache,
                           const void* v_cache, KvFormat cache_fmt, int64_t block_size, const int32_t* blocks,
                           const int32_t* table_start, const int32_t* pos, int64_t window, float scale,
                           const int32_t* tiles, int64_t n_tiles, int heads_per_tile, float* out, uint16_t* twin,
                           cudaStream_t stream) {
  if (n_tiles <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads < n_kv_heads || heads_per_tile < 1 ||
      (n_heads / n_kv_heads) % heads_per_tile != 0)
    return;
  // The narrowest instantiation that holds head_dim; rounds of 32 positions at 256 (the registers
  // of a warp's outputs).
  auto* go = head_dim <= 32    ? &launch<32, 64>
             : head_dim <= 64  ? &launch<64, 64>
             : head_dim <= 128 ? &launch<128, 64>
                               : &launch<256, 32>;
  go(q, n_heads, n_kv_heads, head_dim, k_cache, v_cache, cache_fmt, block_size, blocks, table_start, pos, window, scale,
     tiles, n_tiles, heads_per_tile, out, twin, stream);
}

}  // namespace shardlm::cuda
