// One thread block per (token, group of up to kAttnHeadsPerBlock query heads of one KV head), one
// warp per query head (attention_util.cuh): each round the block stages kAttnTile positions' K and
// V rows of its KV head in shared memory, so a GQA group reads its KV once, not once per query
// head. Each partition of the token's positions (attention_partitions.h) is folded into its own
// state; an unsplit launch walks them all and merges as it goes, a split one gives each its block
// along grid y and attention_combine merges. The result is sum_j exp(s_j - m) v_j /
// sum_j exp(s_j - m), which equals the CPU's normalised form up to rounding.
#include "cuda/paged_attention.h"

#include "cuda/attention_combine.h"
#include "cuda/attention_util.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kTile = detail::kAttnTile;
constexpr int kMaxThreads = detail::kAttnHeadsPerBlock * 32;
// Three builds of the kernel, by the largest head_dim they take: 64, 128 (most models) and 256. A
// lane holds MaxHeadDim / 32 dims of the query and the output; a 64-dim head on the 128 build
// would leave half of each round's loads and products predicated off, and its launch would take
// 128 threads for a round 64 stage. Staged element by element, the 128 build's registers (64) and
// shared rows (16 KiB) let 4 blocks of 256 threads share a multiprocessor. Staged a round ahead it
// may take up to 128 (2 blocks of 256; sm_90a: 106 over bf16, 96 over fp8, the 64 build 94 and
// 80). Held to 80 (3 blocks of 256), ptxas kept the next round's chunks but stretched a round's
// scoring and folding from about 380 instructions to 1250: on an H200 that build, launched with 64
// threads for a 64-dim group of 2, took 134 us for one token at 4096 positions over a bf16 cache
// where the 128 build, unheld, took 47.
constexpr int kMaxHeadDim = 256;
template <int MaxHeadDim, detail::Staging S>
constexpr int kBlocksPerSm = MaxHeadDim <= 128 && S == detail::Staging::kRows ? 4 : 2;

// Chunks per thread and side of a round staged ahead (attention_util.cuh): a round of 16 rows of
// up to MaxHeadDim elements a side is 2 MaxHeadDim chunks, so the launch takes at least
// kStageThreads threads (warps past the group's heads only stage).
constexpr int kChunksPerThread = 2;
template <int MaxHeadDim>
constexpr int kStageThreads = (kTile * MaxHeadDim) / (detail::kChunk * kChunksPerThread);
static_assert(kStageThreads<kMaxHeadDim> <= kMaxThreads, "a widened launch within the kernels' bound");

// A round's staged rows sit a build's largest head_dim apart in shared memory (sk, sv: [kTile]
// rows of MaxHeadDim = 32 DimPerLane floats), whatever the head's: each row's loads are then at a
// fixed offset from one address, where a stride of head_dim had ptxas work out (or branch around)
// an address per row and dim.
template <int DimPerLane>
constexpr int kRowStride = 32 * DimPerLane;

// The round of positions [base, base + cnt) of KV head kvh scored and folded into a warp's state.
template <int DimPerLane>
__device__ __forceinline__ void fold_round(int cnt, const float (&qr)[DimPerLane], int head_dim, float scale,
                                           const float* sk, const float* sv, float& m, float& l,
                                           float (&acc)[DimPerLane]) {
  float s[kTile];
  detail::lane_round_dots<true>(s, qr, sk, kRowStride<DimPerLane>, head_dim);
  detail::warp_fold_round(s, cnt, scale, sv, kRowStride<DimPerLane>, m, l, acc);
}

// Folds positions [a0, a1] of KV head kvh (a partition, or the part of it the token attends to)
// into a warp's state (m, l, acc) from empty, in rounds of kTile staged by the whole block; every
// warp of the block meets every barrier, `active` ones score and fold. Staging S: element by
// element (kRows), or a round ahead in chunks of a cache of that format.
template <detail::Staging S, int DimPerLane>
__device__ __forceinline__ void fold_positions(int a0, int a1, const float (&qr)[DimPerLane], bool active, int head_dim,
                                               const void* k_cache, const void* v_cache, KvFormat fmt,
                                               const int32_t* bt, int64_t block_size, int64_t row, int64_t kvh,
                                               float scale, float* sk, float* sv, float& m, float& l,
                                               float (&acc)[DimPerLane]) {
  detail::warp_state_reset(m, l, acc);
  if constexpr (S == detail::Staging::kRows) {
    for (int base = a0; base <= a1; base += kTile) {
      const int cnt = detail::round_count(base, a1);
      detail::stage_round<kRowStride<DimPerLane>>(sk, sv, k_cache, v_cache, fmt, bt, base, cnt, block_size, row, kvh,
                                                  head_dim);
      __syncthreads();
      if (active) fold_round(cnt, qr, head_dim, scale, sk, sv, m, l, acc);
      __syncthreads();  // sk / sv are restaged by the next round
    }
  } else {
    constexpr KvElem E = detail::kStagedElem<S>;
    const void* const side[2] = {k_cache, v_cache};
    float* const dst[2] = {sk, sv};
    const float side_scale[2] = {fmt.k_scale, fmt.v_scale};
    const int64_t col = kvh * head_dim;
    // The rounds' cache slots, worked out once a round by its first threads (not by every thread
    // for each of its chunks: a 64-bit division each), in two buffers: round r + 1's are written
    // while round r is stored and read after the barrier that follows; the buffer they go to was
    // last read, for round r - 1, two barriers before.
    __shared__ int64_t slots[2][kTile];
    const detail::ChunkPlaces<kChunksPerThread> places(head_dim);
    detail::RoundChunks<E, 2, kChunksPerThread> ahead;
    detail::write_round_slots(slots[0], bt, a0, detail::round_count(a0, a1), block_size);
    __syncthreads();
    detail::load_round_chunks(ahead, side, slots[0], places, detail::round_count(a0, a1), row, col);
    for (int base = a0, r = 0; base <= a1; base += kTile, r ^= 1) {
      const int cnt = detail::round_count(base, a1);
      const int next = base + kTile <= a1 ? detail::round_count(base + kTile, a1) : 0;
      detail::store_round_chunks(ahead, dst, side_scale, places, cnt, kRowStride<DimPerLane>);
      detail::write_round_slots(slots[r ^ 1], bt, base + kTile, next, block_size);
      __syncthreads();
      if (next > 0) detail::load_round_chunks(ahead, side, slots[r ^ 1], places, next, row, col);
      if (active) fold_round(cnt, qr, head_dim, scale, sk, sv, m, l, acc);
      __syncthreads();  // sk / sv are stored again by the next round
    }
  }
}

// A block per (token, KV head, group of query heads), as detail::gqa_block places it. gridDim.y >
// 1: a split launch, blockIdx.y the token's partition counted from its first, states as in
// AttentionSplit.
template <int MaxHeadDim, detail::Staging S>
__global__ void __launch_bounds__(kMaxThreads, kBlocksPerSm<MaxHeadDim, S>)
    paged_attention_kernel(const float* q, int64_t n_heads, int64_t n_kv_heads, int head_dim, const void* k_cache,
                           const void* v_cache, KvFormat fmt, int64_t block_size, const int32_t* blocks,
                           const int32_t* table_start, const int32_t* pos, int64_t window, float scale, float* out,
                           uint16_t* twin, int heads_per_block, int blocks_per_kv, float* states) {
  constexpr int kDimPerLane = MaxHeadDim / 32;
  __align__(16) __shared__ float sk[kTile * MaxHeadDim];
  __align__(16) __shared__ float sv[kTile * MaxHeadDim];
  const detail::GqaBlock g = detail::gqa_block(n_heads, n_kv_heads, heads_per_block, blocks_per_kv);
  const int64_t t = g.item, kvh = g.kvh, h = g.h;
  // Warps past heads_per_block (a launch widened to kStageThreads) only stage.
  const bool active = g.active && static_cast<int>(threadIdx.x >> 5) < heads_per_block;
  const int lane = threadIdx.x & 31;
  float* o = out + (t * n_heads + h) * head_dim;
  uint16_t* o_twin = twin ? twin + (t * n_heads + h) * head_dim : nullptr;

  // Which partitions this block folds; every condition below is the same for the whole block.
  const int p1 = pos[t];
  if (p1 < 0) {  // padding token
    if (active && blockIdx.y == 0) {
      for (int d = lane; d < head_dim; d += 32) detail::put_output(o, o_twin, d, 0.0f);
    }
    return;
  }
  const detail::PartitionWalk w = detail::partition_walk(static_cast<int>(attention_first_position(p1, window)), p1);
  if (w.empty()) return;
  const int32_t* bt = blocks + table_start[t];
  detail::zero_row_tails(sk, head_dim, MaxHeadDim);  // the dots read every lane's dims (lane_round_dots)

  float qr[kDimPerLane];
#pragma unroll
  for (int k = 0; k < kDimPerLane; ++k) {
    const int d = lane + 32 * k;
    qr[k] = active && d < head_dim ? q[(t * n_heads + h) * head_dim + d] : 0.0f;
  }
  float M = -INFINITY, L = 0.0f;  // the merged state of the partitions before (unsplit launch)
  for (int k = w.first; k <= w.last; ++k) {
    float m, l, acc[kDimPerLane];
    fold_positions<S>(w.begin(k), w.end(k), qr, active, head_dim, k_cache, v_cache, fmt, bt, block_size,
                      n_kv_heads * head_dim, kvh, scale, sk, sv, m, l, acc);
    if (active) {
      detail::warp_finish_partition(k, w, w.state(states, t * n_heads + h, head_dim, k), o, head_dim, m, l, acc, M, L,
                                    o_twin);
    }
  }
}

// The build of the kernel for head dims up to MaxHeadDim that stages as `staging` says.
template <int MaxHeadDim>
auto* kernel_for(detail::Staging staging) {
  using detail::Staging;
  return staging == Staging::kBf16  ? paged_attention_kernel<MaxHeadDim, Staging::kBf16>
         : staging == Staging::kFp8 ? paged_attention_kernel<MaxHeadDim, Staging::kFp8>
                                    : paged_attention_kernel<MaxHeadDim, Staging::kRows>;
}

}  // namespace

void paged_attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     const void* k_cache, const void* v_cache, KvFormat cache_fmt, int64_t block_size,
                     const int32_t* blocks, const int32_t* table_start, const int32_t* pos, int64_t window, float scale,
                     float* out, uint16_t* twin, const AttentionSplit& split, cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0) return;
  const int64_t group = n_heads / n_kv_heads;
  if (group <= 0) return;  // fewer query than KV heads: not a layout (the backend refuses it)
  const int heads_per_block = static_cast<int>(group < detail::kAttnHeadsPerBlock ? group : detail::kAttnHeadsPerBlock);
  const int blocks_per_kv = static_cast<int>((group + heads_per_block - 1) / heads_per_block);
  const int64_t parts = split.parts > 1 ? split.parts : 1;
  const dim3 grid(static_cast<unsigned>(T * n_kv_heads * blocks_per_kv), static_cast<unsigned>(parts));
  const void* const sides[2] = {k_cache, v_cache};
  const detail::Staging staging =
      detail::staging_for(detail::chunked_rows(sides, 2, n_kv_heads * head_dim, 0, head_dim), cache_fmt.elem);
  const int build = head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : kMaxHeadDim;
  int threads = heads_per_block * 32;
  if (staging != detail::Staging::kRows) {
    const int least = build == 64 ? kStageThreads<64> : build == 128 ? kStageThreads<128> : kStageThreads<kMaxHeadDim>;
    threads = threads > least ? threads : least;
  }
  auto* kernel = build == 64    ? kernel_for<64>(staging)
                 : build == 128 ? kernel_for<128>(staging)
                                : kernel_for<kMaxHeadDim>(staging);
  kernel<<<grid, threads, 0, stream>>>(q, n_heads, n_kv_heads, static_cast<int>(head_dim), k_cache, v_cache, cache_fmt,
                                       block_size, blocks, table_start, pos, window, scale, out, twin, heads_per_block,
                                       blocks_per_kv, parts > 1 ? split.states : nullptr);
  if (parts > 1) attention_combine(T, n_heads, head_dim, pos, window, parts, split.states, out, twin, stream);
}

int64_t paged_attention_blocks(int64_t T, int64_t n_heads, int64_t n_kv_heads) {
  if (T <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads < n_kv_heads) return 0;
  const int64_t group = n_heads / n_kv_heads;
  const int64_t heads_per_block = group < detail::kAttnHeadsPerBlock ? group : detail::kAttnHeadsPerBlock;
  return T * n_kv_heads * ((group + heads_per_block - 1) / heads_per_block);
}

}  // namespace shardlm::cuda
