// See prefill_latent_attention_mma.h for the scheme; mma_bf16.cuh for the fragment layouts.
#include "cuda/prefill_latent_attention_mma.h"

#include <cstdint>

#include "cuda/latent_mma_round.cuh"

namespace shardlm::cuda {
namespace {

using namespace detail::latent_mma;

// grid: tiles; block: kWarps warps. Tile b: pairs [r0, r0 + kRows) of the run of n tokens from t0,
// pair i being token t0 + i / n_heads, head i % n_heads. vec: staged 8 dims at a time
// (staged_by_vectors).
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    prefill_latent_attention_mma_kernel(const float* q_latent, const float* q_rope, int n_heads, int L, int R,
                                        const void* cache, KvFormat fmt, int64_t block_size, const int32_t* blocks,
                                        const int32_t* table_start, const int32_t* pos, float scale,
                                        const int32_t* tiles, bool vec, float* out) {
  extern __shared__ __align__(16) uint16_t smem_mla[];
  __shared__ int64_t slots[kBN];
  const int64_t t0 = tiles[3 * blockIdx.x];
  const int n = tiles[3 * blockIdx.x + 1], r0 = tiles[3 * blockIdx.x + 2];
  const int pairs = n * n_heads;
  const Round rd(L, R, smem_mla, slots, cache, fmt, block_size, blocks + table_start[t0], vec);
  const int g = rd.g, c = rd.c;

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
  rd.stage_queries(q_latent, q_rope, [&](int r) -> int64_t {
    const int pr = r0 + r;
    return pr < pairs ? (t0 + pr / n_heads) * n_heads + pr % n_heads : -1;  // (token, head)
  });

  const float row_scale = rd.row_scale();
  const float score_scale = scale * row_scale * kLog2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kMaxDt][4];
#pragma unroll
  for (int k = 0; k < kMaxDt; ++k) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;
  for (int base = 0; base <= kv_hi; base += kBN) rd.fold(base, kv_hi, row_lo, row_hi, score_scale, m, l, o);

  const int dtiles = rd.dtiles(), dtw = rd.dtw(), dt0 = rd.dt0();
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
  const bool vec = staged_by_vectors(kv_lora, rope_dim, cache);
  // Opted in to the largest geometry once, whatever this one's size: the default limit is 48 KiB
  // less the kernel's static shared memory (its slots), so a geometry of exactly 48 KiB (a latent
  // and rope width padded to 480) would fail every launch. A failure shows at launch.
  static const cudaError_t opted =
      cudaFuncSetAttribute(prefill_latent_attention_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Geometry(kMaxLora, kMaxRope).bytes()));
  (void)opted;
  prefill_latent_attention_mma_kernel<<<static_cast<unsigned>(n_tiles), kWarps * 32, bytes, stream>>>(
      q_latent, q_rope, static_cast<int>(n_heads), static_cast<int>(kv_lora), static_cast<int>(rope_dim), cache,
      cache_fmt, block_size, blocks, table_start, pos, scale, tiles, vec, out);
}

}  // namespace shardlm::cuda
