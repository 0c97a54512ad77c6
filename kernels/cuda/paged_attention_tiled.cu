// A thread block per (tile of up to Q tokens, KV head, group of up to kAttnHeadsPerBlock query
// heads), a warp per query head holding the state of each of the tile's tokens for its head.
// Rounds of kAttnTile cache rows are staged once for a run of the tile's tokens; each warp then
// takes the run's tokens in turn, scoring and folding the round exactly as paged_attention.cu's
// fold_positions does for one token (the same rounds: without a window every token's partition k
// starts at k * kAttnPartition), and merges each token's partitions with warp_finish_partition, as
// that kernel's unsplit launch does.
#include "cuda/paged_attention_tiled.h"

#include <climits>

#include "cuda/attention_util.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kTile = detail::kAttnTile;
constexpr int kMaxThreads = detail::kAttnHeadsPerBlock * 32;

// The cache's geometry as the kernel received it.
struct Cache {
  const void* k;
  const void* v;
  KvFormat fmt;
  int64_t block_size, row, kvh;  // row: elements per cache slot (every KV head); kvh: this block's
  int head_dim;
};

// A warp's state for token i of its run lives in shared memory (registers for Q tokens would cost
// the kernel its occupancy): acc[i * MaxHeadDim + d] for the dims its lanes own, and
// ml[i * 4 + 0..3] = the partition's running max m and sum l and the merged state's M and L, as
// paged_attention.cu keeps them in registers for its one token. Every lane reads m, l, M, L;
// lane 0 writes them (all lanes hold the same values), and __syncwarp orders the two.
template <int D>
struct TokenState {
  float acc[D], m, l, M, L;
  __device__ void load(const float* sacc, const float* sml, int lane) {
#pragma unroll
    for (int x = 0; x < D; ++x) acc[x] = sacc[lane + 32 * x];
    m = sml[0];
    l = sml[1];
    M = sml[2];
    L = sml[3];
  }
  __device__ void store(float* sacc, float* sml, int lane) const {
#pragma unroll
    for (int x = 0; x < D; ++x) sacc[lane + 32 * x] = acc[x];
    __syncwarp();  // every lane has read the old m, l, M, L
    if (lane == 0) sml[0] = m, sml[1] = l, sml[2] = M, sml[3] = L;
    __syncwarp();
  }
};

// Runs tokens [t0, t0 + n) of one sequence (block table bt; n > 1 only for tokens without a
// window, whose partitions start at the same positions) for this warp's query head h: partition
// by partition, in rounds staged by the whole block. Every warp meets every barrier; `active`
// ones (a head of the group) score, fold and write. sacc, sml: this warp's state area.
template <int MaxHeadDim>
__device__ __forceinline__ void attend_run(int64_t t0, int n, int64_t h, bool active, const float* q, int64_t n_heads,
                                           const Cache& c, const int32_t* bt, const int32_t* pos, int64_t window,
                                           float scale, float* out, uint16_t* twin, float* sk, float* sv, float* sacc,
                                           float* sml) {
  constexpr int D = MaxHeadDim / 32;
  const int lane = threadIdx.x & 31;
  const int hd = c.head_dim;
  // Token i attends to [p0(i), pos[t0 + i]]; its partitions are partition_walk's.
  auto walk = [&](int i) {
    const int p1 = pos[t0 + i];
    return detail::partition_walk(static_cast<int>(attention_first_position(p1, window)), p1);
  };
  int kmin = INT_MAX, kmax = -1;  // the partitions any token of the run attends to
  for (int i = 0; i < n; ++i) {
    const detail::PartitionWalk w = walk(i);
    kmin = w.k0 < kmin ? w.k0 : kmin;
    kmax = w.k1 > kmax ? w.k1 : kmax;
    if (active && lane == 0) sml[i * 4 + 2] = -INFINITY, sml[i * 4 + 3] = 0.0f;  // M, L
  }
  for (int k = kmin; k <= kmax; ++k) {
    int a0 = INT_MAX, a1 = -1;  // partition k's positions that some token of the run attends to
    for (int i = 0; i < n; ++i) {
      const detail::PartitionWalk w = walk(i);
      if (k < w.k0 || k > w.k1) continue;
      a0 = w.begin(k) < a0 ? w.begin(k) : a0;
      a1 = w.end(k) > a1 ? w.end(k) : a1;
      if (active) {  // the partition's state starts empty
#pragma unroll
        for (int x = 0; x < D; ++x) sacc[i * MaxHeadDim + lane + 32 * x] = 0.0f;
        if (lane == 0) sml[i * 4] = -INFINITY, sml[i * 4 + 1] = 0.0f;
      }
    }
    __syncwarp();
    for (int base = a0; base <= a1; base += kTile) {
      const int cnt = detail::round_count(base, a1);
      detail::stage_round<MaxHeadDim>(sk, sv, c.k, c.v, c.fmt, bt, base, cnt, c.block_size, c.row, c.kvh, hd);
      __syncthreads();
      if (active) {
#pragma unroll 1
        for (int i = 0; i < n; ++i) {
          const detail::PartitionWalk w = walk(i);
          // The token's part of the round, from its first row (its partition starts at a0).
          if (k < w.k0 || k > w.k1 || base > w.end(k)) continue;  // the same for the whole warp
          const int ci = detail::round_count(base, w.end(k));
          float qr[D];  // the token's query slice (from L1: read again each round, not held)
#pragma unroll
          for (int x = 0; x < D; ++x) {
            const int d = lane + 32 * x;
            qr[x] = d < hd ? q[((t0 + i) * n_heads + h) * hd + d] : 0.0f;
          }
          float s[kTile];
          detail::lane_round_dots<true>(s, qr, sk, MaxHeadDim, hd);
          TokenState<D> st;
          st.load(sacc + i * MaxHeadDim, sml + i * 4, lane);
          detail::warp_fold_round(s, ci, scale, sv, MaxHeadDim, st.m, st.l, st.acc);
          st.store(sacc + i * MaxHeadDim, sml + i * 4, lane);
        }
      }
      __syncthreads();  // sk / sv are restaged by the next round
    }
    if (active) {
#pragma unroll 1
      for (int i = 0; i < n; ++i) {
        const detail::PartitionWalk w = walk(i);
        if (k < w.k0 || k > w.k1) continue;
        TokenState<D> st;
        st.load(sacc + i * MaxHeadDim, sml + i * 4, lane);
        const int64_t row = ((t0 + i) * n_heads + h) * hd;
        detail::warp_finish_partition(k, w, nullptr, out + row, hd, st.m, st.l, st.acc, st.M, st.L,
                                      twin ? twin + row : nullptr);
        st.store(sacc + i * MaxHeadDim, sml + i * 4, lane);
      }
    }
  }
}

// Shared memory of a block: the staged round (K and V rows) and each warp's token states.
template <int MaxHeadDim, int Q>
constexpr size_t kSharedBytes = sizeof(float) *
                                (2 * kTile * MaxHeadDim + detail::kAttnHeadsPerBlock * Q * (MaxHeadDim + 4));

// A block per (tile, KV head, group of query heads), as detail::gqa_block places it; tile b takes
// tokens [b * Q, b * Q + Q). The tile's tokens go in runs: consecutive tokens with the same table start,
// no window and a real position share one; any other token runs alone.
template <int MaxHeadDim, int Q>
__global__ void __launch_bounds__(kMaxThreads, MaxHeadDim <= 128 ? 3 : 2)
    paged_attention_tiled_kernel(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int head_dim,
                                 const void* k_cache, const void* v_cache, KvFormat fmt, int64_t block_size,
                                 const int32_t* blocks, const int32_t* table_start, const int32_t* pos, int64_t window,
                                 float scale, float* out, uint16_t* twin, int heads_per_block, int blocks_per_kv) {
  extern __shared__ float smem[];
  float* sk = smem;
  float* sv = sk + kTile * MaxHeadDim;
  // Staged rows sit MaxHeadDim apart with zeros past head_dim, as in paged_attention.cu.
  detail::zero_row_tails(sk, head_dim, MaxHeadDim);
  const detail::GqaBlock g = detail::gqa_block(n_heads, n_kv_heads, heads_per_block, blocks_per_kv);
  const int64_t tile = g.item, kvh = g.kvh, h = g.h;
  const bool active = g.active;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const Cache c{k_cache, v_cache, fmt, block_size, n_kv_heads * head_dim, kvh, head_dim};
  float* sacc = sv + kTile * MaxHeadDim + warp * Q * MaxHeadDim;
  float* sml = sv + kTile * MaxHeadDim + detail::kAttnHeadsPerBlock * Q * MaxHeadDim + warp * Q * 4;
  const int64_t end = (tile + 1) * Q < T ? (tile + 1) * Q : T;
  for (int64_t t0 = tile * Q; t0 < end;) {
    int n = 1;
    if (pos[t0] < 0) {  // padding token: a zero output
      if (active) {
        const int64_t row = (t0 * n_heads + h) * head_dim;
        for (int d = lane; d < head_dim; d += 32) detail::put_output(out + row, twin ? twin + row : nullptr, d, 0.0f);
      }
      t0 += 1;
      continue;
    }
    if (window <= 0) {
      while (t0 + n < end && n < Q && table_start[t0 + n] == table_start[t0] && pos[t0 + n] >= 0) ++n;
    }
    attend_run<MaxHeadDim>(t0, n, h, active, q, n_heads, c, blocks + table_start[t0], pos, window, scale, out, twin, sk,
                           sv, sacc, sml);
    t0 += n;
  }
}

template <int MaxHeadDim, int Q>
void launch(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const void* k_cache,
            const void* v_cache, KvFormat fmt, int64_t block_size, const int32_t* blocks, const int32_t* table_start,
            const int32_t* pos, int64_t window, float scale, float* out, uint16_t* twin, cudaStream_t stream) {
  const int64_t group = n_heads / n_kv_heads;
  const int heads_per_block = static_cast<int>(group < detail::kAttnHeadsPerBlock ? group : detail::kAttnHeadsPerBlock);
  const int blocks_per_kv = static_cast<int>((group + heads_per_block - 1) / heads_per_block);
  const int64_t tiles = (T + Q - 1) / Q;
  constexpr size_t bytes = kSharedBytes<MaxHeadDim, Q>;
  if (bytes > 48 * 1024) {  // above the default the kernel must opt in, once (a failure shows at launch)
    static const cudaError_t opted =
        cudaFuncSetAttribute(paged_attention_tiled_kernel<MaxHeadDim, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
    (void)opted;
  }
  paged_attention_tiled_kernel<MaxHeadDim, Q>
      <<<static_cast<unsigned>(tiles * n_kv_heads * blocks_per_kv), heads_per_block * 32, bytes, stream>>>(
          q, T, n_heads, n_kv_heads, static_cast<int>(head_dim), k_cache, v_cache, fmt, block_size, blocks, table_start,
          pos, window, scale, out, twin, heads_per_block, blocks_per_kv);
}

}  // namespace

int paged_attention_tile_tokens(int64_t head_dim) { return head_dim <= 128 ? 4 : 2; }

void paged_attention_tiled(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                           const void* k_cache, const void* v_cache, KvFormat cache_fmt, int64_t block_size,
                           const int32_t* blocks, const int32_t* table_start, const int32_t* pos, int64_t window,
                           float scale, float* out, uint16_t* twin, cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads < n_kv_heads) return;
  if (head_dim <= 128) {
    launch<128, 4>(q, T, n_heads, n_kv_heads, head_dim, k_cache, v_cache, cache_fmt, block_size, blocks, table_start,
                   pos, window, scale, out, twin, stream);
  } else {
    launch<256, 2>(q, T, n_heads, n_kv_heads, head_dim, k_cache, v_cache, cache_fmt, block_size, blocks, table_start,
                   pos, window, scale, out, twin, stream);
  }
}

}  // namespace shardlm::cuda
