// See decode_latent_attention_mma.h for the scheme, latent_mma_round.cuh for a round.
#include "cuda/decode_latent_attention_mma.h"

#include "cuda/attention_combine.h"
#include "cuda/latent_mma_round.cuh"

namespace shardlm::cuda {
namespace {

using namespace detail::latent_mma;
static_assert(kRows == kDecodeLatentMmaHeads, "a block's rows are heads of one token");
static_assert(kAttnPartition % kBN == 0, "a partition's rounds start on its first position");

constexpr float kLn2 = 0.6931471805599453f;

// The lane's outputs of row i (dims dt * 8 + 2c + e of its warp's n-tiles, below L) as fn(d, value),
// each value times the fp8 row scale (1 otherwise): a partition's weighted sums as a state holds them.
template <typename Fn>
__device__ inline void for_row_outputs(const Round& rd, const float (&o)[kMaxDt][4], int i, float row_scale, Fn fn) {
  const int dtiles = rd.dtiles(), dtw = rd.dtw(), dt0 = rd.dt0();
#pragma unroll
  for (int k = 0; k < kMaxDt; ++k) {
    const int dt = dt0 + k;
    if (k >= dtw || dt >= dtiles) break;  // the same in every lane
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int d = dt * 8 + 2 * rd.c + e;
      if (d < rd.L) fn(d, __fmul_rn(o[k][2 * i + e], row_scale));
    }
  }
}

// blockIdx.x = t * tiles + b: heads [16 b, 16 b + 16) of token t, rows past n_heads idle (they
// stage, fold nothing and meet every barrier). gridDim.y > 1: a split launch (partition_walk).
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    decode_latent_attention_mma_kernel(const float* q_latent, const float* q_rope, int n_heads, int L, int R,
                                       const void* cache, KvFormat fmt, int64_t block_size, const int32_t* blocks,
                                       const int32_t* table_start, const int32_t* pos, float scale, int tiles, bool vec,
                                       float* out, float* states) {
  extern __shared__ __align__(16) uint16_t smem_mla_decode[];
  __shared__ int64_t slots[kBN];
  const int64_t t = blockIdx.x / tiles;
  const int h0 = static_cast<int>(blockIdx.x % tiles) * kRows;
  const int p1 = pos[t];
  if (p1 < 0) {  // a padding token: zeros, once
    if (blockIdx.y == 0) {
      for (int i = threadIdx.x; i < kRows * L; i += blockDim.x) {
        const int h = h0 + i / L;
        if (h < n_heads) out[(t * n_heads + h) * L + i % L] = 0.0f;
      }
    }
    return;
  }
  const detail::PartitionWalk w = detail::partition_walk(0, p1);  // no window for MLA
  if (w.empty()) return;
  const Round rd(L, R, smem_mla_decode, slots, cache, fmt, block_size, blocks + table_start[t], vec);
  rd.stage_queries(q_latent, q_rope,
                   [&](int r) -> int64_t { return h0 + r < n_heads ? t * n_heads + h0 + r : int64_t{-1}; });
  const float row_scale = rd.row_scale();
  const float score_scale = scale * row_scale * kLog2e;
  // This lane's rows g and g + 8 are heads h0 + g + 8 i: live below n_heads.
  auto live = [&](int i) { return h0 + rd.g + 8 * i < n_heads; };

  float M[2] = {0.0f, 0.0f}, Lsum[2] = {0.0f, 0.0f};  // the partitions before, merged (unsplit launch)
  for (int k = w.first; k <= w.last; ++k) {
    const int a0 = w.begin(k), a1 = w.end(k);
    const int lo[2] = {a0, a0}, hi[2] = {live(0) ? a1 : -1, live(1) ? a1 : -1};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[kMaxDt][4];
#pragma unroll
    for (int j = 0; j < kMaxDt; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    for (int base = a0; base <= a1; base += kBN) rd.fold(base, a1, lo, hi, score_scale, m, l, o);

      // The partition's state in attention_combine's terms: m in natural units, l summed over the
      // quad, the weighted sums scaled; then as warp_finish_partition does with a warp's state.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float lf = l[i];
      lf += __shfl_xor_sync(0xffffffffu, lf, 1);
      lf += __shfl_xor_sync(0xffffffffu, lf, 2);
      if (!live(i)) continue;
      const int64_t th = t * n_heads + h0 + rd.g + 8 * i;  // (token, head)
      const float mk = __fmul_rn(m[i], kLn2);
      float* dst = out + th * L;
      if (w.k0 == w.k1) {  // the token's one partition
        const float inv = detail::reciprocal(lf);
        for_row_outputs(rd, o, i, row_scale, [&](int d, float v) { dst[d] = detail::normalised(v, inv); });
      } else if (w.split) {  // the state, for attention_combine
        float* st = w.state(states, th, L, k);
        if (rd.warp == 0 && rd.c == 0) {
          st[0] = mk;
          st[1] = lf;
        }
        for_row_outputs(rd, o, i, row_scale, [&](int d, float v) { st[2 + d] = v; });
      } else if (k == w.k0) {  // the running state starts as the first partition's (the sums in dst:
                               // only this lane reads back what it wrote)
        M[i] = mk;
        Lsum[i] = lf;
        for_row_outputs(rd, o, i, row_scale, [&](int d, float v) { dst[d] = v; });
      } else {
        const detail::MergeScale s = detail::merge_scale(M[i], mk);
        M[i] = s.max;
        Lsum[i] = detail::merge_value(Lsum[i], lf, s);
        const bool last = k == w.k1;
        const float inv = last ? detail::reciprocal(Lsum[i]) : 1.0f;
        for_row_outputs(rd, o, i, row_scale, [&](int d, float v) {
          const float merged = detail::merge_value(dst[d], v, s);
          dst[d] = last ? detail::normalised(merged, inv) : merged;
        });
      }
    }
  }
}

}  // namespace

int64_t decode_latent_attention_mma_blocks(int64_t T, int64_t n_heads) {
  if (T <= 0 || n_heads <= 0) return 0;
  return T * ((n_heads + kRows - 1) / kRows);
}

void decode_latent_attention_mma(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads,
                                 int64_t kv_lora, int64_t rope_dim, const void* cache, KvFormat cache_fmt,
                                 int64_t block_size, const int32_t* blocks, const int32_t* table_start,
                                 const int32_t* pos, float scale, float* out, const AttentionSplit& split,
                                 cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || kv_lora <= 0 || kv_lora > kMaxLora || rope_dim < 0 || rope_dim > kMaxRope) return;
  const Geometry geo(static_cast<int>(kv_lora), static_cast<int>(rope_dim));
  const size_t bytes = geo.bytes();
  // Opted in to the largest geometry once, whatever this one's size: the default limit is 48 KiB
  // less the kernel's static shared memory (its slots), so a geometry of exactly 48 KiB (a latent
  // and rope width padded to 480) would fail every launch. A failure shows at launch.
  static const cudaError_t opted =
      cudaFuncSetAttribute(decode_latent_attention_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Geometry(kMaxLora, kMaxRope).bytes()));
  (void)opted;
  const int64_t tiles = (n_heads + kRows - 1) / kRows;
  const int64_t parts = split.parts > 1 ? split.parts : 1;
  const dim3 grid(static_cast<unsigned>(T * tiles), static_cast<unsigned>(parts));
  decode_latent_attention_mma_kernel<<<grid, kWarps * 32, bytes, stream>>>(
      q_latent, q_rope, static_cast<int>(n_heads), static_cast<int>(kv_lora), static_cast<int>(rope_dim), cache,
      cache_fmt, block_size, blocks, table_start, pos, scale, static_cast<int>(tiles),
      detail::latent_mma::staged_by_vectors(kv_lora, rope_dim, cache), out, parts > 1 ? split.states : nullptr);
  if (parts > 1) attention_combine(T, n_heads, kv_lora, pos, 0, parts, split.states, out, nullptr, stream);
}

}  // namespace shardlm::cuda
