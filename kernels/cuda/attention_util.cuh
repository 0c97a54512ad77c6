// Pieces shared by the paged attention kernels (not part of the launcher interface).
//
// Both kernels give a thread block to one token and a group of up to kAttnHeadsPerBlock query
// heads that read the same cache rows (the query heads of one KV head; MLA: any heads, they all
// read the latent cache), one warp per head. Rounds of kAttnTile positions are staged in shared
// memory by the whole block, so a cache row is read from global memory once per block instead of
// once per head; each warp then scores the round against its own query (lanes split the
// dimensions; the round's 16 dot products are reduced together, warp_fold_round) and folds it into
// its running max, sum and accumulators (online softmax in fp32, positions in increasing order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "bf16_bits.h"
#include "cuda/attention_partitions.h"
#include "cuda/convert_pairs.cuh"
#include "cuda/mma_stage.cuh"
#include "cuda/warp_exchange.cuh"
#include "cuda/warp_sum16.h"
#include "kv_cache_format.h"

namespace shardlm::cuda::detail {

constexpr int kAttnTile = 16;          // positions staged per round
constexpr int kAttnHeadsPerBlock = 8;  // warps (query heads) per block at most

// Cache slot of logical position p of a sequence whose physical blocks are listed in bt.
__device__ inline int64_t cache_slot(const int32_t* bt, int64_t p, int64_t block_size) {
  return static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
}

// A warp's online-softmax state made empty: running max -inf, sum 0, accumulators 0.
template <int Acc>
__device__ inline void warp_state_reset(float& m, float& l, float (&acc)[Acc]) {
  m = -INFINITY;
  l = 0.0f;
#pragma unroll
  for (int a = 0; a < Acc; ++a) acc[a] = 0.0f;
}

// Positions of the round starting at base that fall in [.., last]: at most kAttnTile.
__device__ inline int round_count(int base, int last) {
  return last - base + 1 < kAttnTile ? last - base + 1 : kAttnTile;
}

// GQA: where a block and its warp sit in a launch whose blockIdx.x is
// (item * n_kv_heads + kv head) * blocks_per_kv + b (item: a token, or a tile of tokens): warp w
// takes query head kvh * group + b * heads_per_block + w, idle (inactive) when that is past the
// group (a group that does not divide evenly); idle warps still stage rows and meet every barrier.
struct GqaBlock {
  int64_t item, kvh, h;
  bool active;  // warp-uniform
};
__device__ inline GqaBlock gqa_block(int64_t n_heads, int64_t n_kv_heads, int heads_per_block, int blocks_per_kv) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t ik = blockIdx.x / blocks_per_kv;  // item * n_kv_heads + kvh
  const int64_t in_group = static_cast<int64_t>(blockIdx.x % blocks_per_kv) * heads_per_block + (threadIdx.x >> 5);
  GqaBlock g;
  g.item = ik / n_kv_heads;
  g.kvh = ik % n_kv_heads;
  g.h = g.kvh * group + in_group;
  g.active = in_group < group;
  return g;
}

// ---- Staging a round ----
// A round's cache reads are issued kStageInFlight at a time per thread and side before any of them
// is stored: a store to shared memory, through a pointer the compiler cannot tell apart from the
// cache, would otherwise wait for each load in turn. Staged element by element, with the block
// table read and the slot divided out again for every element, a 16-position round of 64-dim rows
// took some 14 us on an H200: one chain of memory latencies per element. The slots of a round's
// positions are worked out once, by as many threads, into shared memory. Four loads a side keeps
// the 128-dim paged attention kernel within its 64 registers (with eight it spilled 92 bytes).
constexpr int kStageInFlight = 4;

// The cache slots of positions [base, base + cnt) into slots[0, cnt), one per thread of the first
// cnt (cnt <= kAttnTile <= blockDim.x); a barrier must come before they are read.
__device__ inline void write_round_slots(int64_t* slots, const int32_t* bt, int base, int cnt, int64_t block_size) {
  if (static_cast<int>(threadIdx.x) < cnt) slots[threadIdx.x] = cache_slot(bt, base + threadIdx.x, block_size);
}

// write_round_slots for the whole block into a round's own shared array. Every thread of the block
// calls it (it ends with a barrier); the caller's barrier after the round's use keeps the next
// round from overwriting them early.
__device__ inline const int64_t* round_slots(const int32_t* bt, int base, int cnt, int64_t block_size) {
  __shared__ int64_t slots[kAttnTile];
  write_round_slots(slots, bt, base, cnt, block_size);
  __syncthreads();
  return slots;
}

// A cache element's code as it is stored, and its value as kv_load reads it.
template <KvElem E>
struct KvCode {
  using T = float;
};
template <>
struct KvCode<KvElem::BF16> {
  using T = uint16_t;
};
template <>
struct KvCode<KvElem::FP8> {
  using T = uint8_t;
};
template <KvElem E>
__device__ inline float kv_value(typename KvCode<E>::T c, float scale) {
  if constexpr (E == KvElem::BF16) {
    return bf16_bits::to_f32(c);
  } else if constexpr (E == KvElem::FP8) {
    return e4m3_to_f32(c) * scale;
  } else {
    return c;
  }
}

// Columns [col, col + width) of the cache rows at slots[0, cnt) (stride elements a slot) of each of
// Sides cache sides, as fp32 into dst[s][j * RowStride + c], or dst[s][j * width + c] for RowStride
// 0 (consecutive threads, consecutive columns). A pass past the round's last element reads its
// first (a row that exists) and stores nothing.
template <KvElem E, int Sides, int InFlight, int RowStride>
__device__ inline void stage_rows(float* const (&dst)[Sides], const void* const (&side)[Sides],
                                  const float (&scale)[Sides], const int64_t* slots, int cnt, int64_t stride,
                                  int64_t col, int width) {
  using T = typename KvCode<E>::T;
  const int n = cnt * width, step = static_cast<int>(blockDim.x);
  for (int i0 = static_cast<int>(threadIdx.x); i0 < n; i0 += InFlight * step) {
    T c[Sides][InFlight];
    int at[InFlight];
#pragma unroll
    for (int b = 0; b < InFlight; ++b) {
      const int i = i0 + b * step < n ? i0 + b * step : 0;
      const int j = i / width, e = i - j * width;
      const int64_t off = slots[j] * stride + col + e;
      at[b] = j * RowStride + e;  // unused for RowStride 0
#pragma unroll
      for (int s = 0; s < Sides; ++s) c[s][b] = static_cast<const T*>(side[s])[off];
    }
#pragma unroll
    for (int b = 0; b < InFlight; ++b) {
      const int i = i0 + b * step;
      if (i < n) {
#pragma unroll
        for (int s = 0; s < Sides; ++s) dst[s][RowStride == 0 ? i : at[b]] = kv_value<E>(c[s][b], scale[s]);
      }
    }
  }
}

// stage_rows for a cache of format elem.
template <int Sides, int RowStride = 0, int InFlight = kStageInFlight>
__device__ inline void stage_rows(float* const (&dst)[Sides], const void* const (&side)[Sides],
                                  const float (&scale)[Sides], KvElem elem, const int64_t* slots, int cnt,
                                  int64_t stride, int64_t col, int width) {
  if (elem == KvElem::BF16) {
    stage_rows<KvElem::BF16, Sides, InFlight, RowStride>(dst, side, scale, slots, cnt, stride, col, width);
  } else if (elem == KvElem::FP8) {
    stage_rows<KvElem::FP8, Sides, InFlight, RowStride>(dst, side, scale, slots, cnt, stride, col, width);
  } else {
    stage_rows<KvElem::F32, Sides, InFlight, RowStride>(dst, side, scale, slots, cnt, stride, col, width);
  }
}

// GQA: the whole block stages the K and V rows of KV head kvh at positions [base, base + cnt) in
// sk, sv (cnt rows of head_dim, RowStride floats apart or packed for 0, fp32, read back as
// kv_cache_format.h reads them, exactly as the CPU kernels do). row: elements per cache slot
// (every KV head). Every thread of the block calls it.
template <int RowStride = 0>
__device__ inline void stage_round(float* sk, float* sv, const void* k_cache, const void* v_cache, KvFormat fmt,
                                   const int32_t* bt, int base, int cnt, int64_t block_size, int64_t row, int64_t kvh,
                                   int head_dim) {
  const int64_t* slots = round_slots(bt, base, cnt, block_size);
  float* const dst[2] = {sk, sv};
  const void* const side[2] = {k_cache, v_cache};
  const float scale[2] = {fmt.k_scale, fmt.v_scale};
  stage_rows<2, RowStride>(dst, side, scale, fmt.elem, slots, cnt, row, kvh * head_dim, head_dim);
}

// ---- Rounds staged a round ahead ----
// Where the rows allow it (below), the paged kernels stage a round from registers loaded during the
// round before: each thread loads its share of round r + 1's rows in 8-element chunks (16-byte
// loads) right after round r is stored, and the warps score and fold round r while those loads are
// in flight. One memory latency per round, overlapped with the round's arithmetic, where
// stage_rows spends several in a row before any. On an H200 (16 heads on 8 KV heads of 64 dims,
// partitions of 512) one token at 4096 positions took 78 us over a bf16 cache where stage_rows took
// 311 (fp8: 106 and 353), and 8 tokens at 32768 took 768 us where it took 1368 (fp8: 1030, 1551).
// The values stored are kv_value's, so the bits are stage_rows'.
constexpr int kChunk = 8;  // elements of a staged chunk (mma_stage.cuh's raw8)

// Whether rows of `width` elements from column `col`, slots `stride` elements apart, can be staged
// in chunks from these sides: every chunk 8 elements on an 8-element boundary of a 16-byte-aligned
// side. Host side: the launchers choose the kernel.
inline bool chunked_rows(const void* const* sides, int n_sides, int64_t stride, int64_t col, int64_t width) {
  if (width % kChunk != 0 || col % kChunk != 0 || stride % kChunk != 0) return false;
  for (int s = 0; s < n_sides; ++s)
    if (reinterpret_cast<uintptr_t>(sides[s]) % 16 != 0) return false;
  return true;
}

// A thread's share of a round's chunks as loaded: up to PerThread chunks of each of Sides sides.
template <KvElem E, int Sides, int PerThread>
struct RoundChunks {
  uint32_t w[PerThread][Sides][kRawWords<E>];
};

// Where this thread's chunks fall in a round of rows of `width` elements: chunk i = threadIdx.x +
// b * blockDim.x (b < PerThread) is in row[b] = i / (width / kChunk) from column col[b] =
// i % (width / kChunk) * kChunk; row[b] = kAttnTile (no row) past a round's rows. The same in every
// round, so it is worked out once, not with a division per chunk and round. The launch must have
// kAttnTile * width / kChunk <= PerThread * blockDim.x.
template <int PerThread>
struct ChunkPlaces {
  int row[PerThread], col[PerThread];
  __device__ explicit ChunkPlaces(int width) {
    const int per_row = width / kChunk;
#pragma unroll
    for (int b = 0; b < PerThread; ++b) {
      const int i = static_cast<int>(threadIdx.x) + b * static_cast<int>(blockDim.x);
      const int j = i / per_row;
      row[b] = j < kAttnTile ? j : kAttnTile;
      col[b] = (i - j * per_row) * kChunk;
    }
  }
  // Calls f(b, j, c) for each of this thread's chunks in the round's first cnt rows.
  template <typename F>
  __device__ void each(int cnt, F f) const {
#pragma unroll
    for (int b = 0; b < PerThread; ++b) {
      if (row[b] < cnt) f(b, row[b], col[b]);
    }
  }
};

// Loads this thread's chunks of the round's first cnt rows, whose cache slots are slots[0, cnt)
// (write_round_slots; columns [col, col + width) of a slot).
template <KvElem E, int Sides, int PerThread>
__device__ inline void load_round_chunks(RoundChunks<E, Sides, PerThread>& r, const void* const (&side)[Sides],
                                         const int64_t* slots, const ChunkPlaces<PerThread>& places, int cnt,
                                         int64_t stride, int64_t col) {
  places.each(cnt, [&](int b, int j, int c) {
    const int64_t off = slots[j] * stride + col + c;
#pragma unroll
    for (int s = 0; s < Sides; ++s) raw8<E>(side[s], off, r.w[b][s]);
  });
}

// The eight elements of a bf16 or fp8 chunk as kv_value reads them (fp8: a pair of codes a
// conversion).
template <KvElem E>
__device__ inline void chunk_values(const uint32_t (&w)[kRawWords<E>], float scale, float (&v)[kChunk]) {
  static_assert(E == KvElem::BF16 || E == KvElem::FP8, "an fp32 cache is staged by stage_rows");
#pragma unroll
  for (int q = 0; q < kChunk / 2; ++q) {
    if constexpr (E == KvElem::BF16) {
      v[2 * q] = __uint_as_float(w[q] << 16);
      v[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    } else {
      e4m3x2_to_f32(w[q / 2] >> (16 * (q % 2)), v[2 * q], v[2 * q + 1]);
      v[2 * q] *= scale;
      v[2 * q + 1] *= scale;
    }
  }
}

// Stores the chunks load_round_chunks loaded (with the same places and cnt) as fp32 into
// dst[s][j * dst_stride + c], as stage_rows does.
template <KvElem E, int Sides, int PerThread>
__device__ inline void store_round_chunks(const RoundChunks<E, Sides, PerThread>& r, float* const (&dst)[Sides],
                                          const float (&scale)[Sides], const ChunkPlaces<PerThread>& places, int cnt,
                                          int dst_stride) {
  places.each(cnt, [&](int b, int j, int c) {
    const int at = j * dst_stride + c;
#pragma unroll
    for (int s = 0; s < Sides; ++s) {
      float v[kChunk];
      chunk_values<E>(r.w[b][s], scale[s], v);
#if defined(__CUDA_ARCH__)
      float4* d = reinterpret_cast<float4*>(dst[s] + at);  // 32-byte aligned: dst_stride and c are multiples of 8
      d[0] = make_float4(v[0], v[1], v[2], v[3]);
      d[1] = make_float4(v[4], v[5], v[6], v[7]);
#else
      for (int e = 0; e < kChunk; ++e) dst[s][at + e] = v[e];
#endif
    }
  });
}

// How a paged kernel stages its rounds: element by element with the format read at run time
// (stage_rows, any layout), or in chunks a round ahead for a bf16 or fp8 cache (chunked_rows). An
// fp32 cache stays on stage_rows: its round ahead takes twice the registers, and on an H200 the
// fp32 launch that held them lost to stage_rows at 8 x 32768 positions (2056 against 1374 us).
enum class Staging { kRows, kBf16, kFp8 };
template <Staging S>
constexpr KvElem kStagedElem = S == Staging::kBf16 ? KvElem::BF16 : KvElem::FP8;
inline Staging staging_for(bool chunked, KvElem elem) {
  if (!chunked || elem == KvElem::F32) return Staging::kRows;
  return elem == KvElem::BF16 ? Staging::kBf16 : Staging::kFp8;
}

// GQA: s[j] = this lane's share of the dot product of the query (its dims d = lane + 32 x, in qr)
// with staged key row j (sk + j * stride), for every row of the round. Rows past those staged this
// round hold what shared memory held before; their sums go unused (warp_fold_round), and without a
// test per row the dots take about a quarter fewer instructions. A stride known at compile time
// puts every row's loads at fixed offsets from one address. Padded: every row is readable for 32 D
// floats and holds zeros (finite values would do) past head_dim, where the query is zero, so no
// dim is tested either.
template <bool Padded, int D>
__device__ inline void lane_round_dots(float (&s)[kAttnTile], const float (&qr)[D], const float* sk, int stride,
                                       int head_dim) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kAttnTile; ++j) {
    s[j] = 0.0f;
#pragma unroll
    for (int x = 0; x < D; ++x) {
      const int d = lane + 32 * x;
      if (Padded || d < head_dim) s[j] += qr[x] * sk[j * stride + d];
    }
  }
}

// Zeros in columns [width, stride) of rows [0, kAttnTile) at rows + j * stride (shared memory), for
// lane_round_dots<true>: staging writes only [0, width). The whole block calls it; the barriers
// before the first round's use publish it.
__device__ inline void zero_row_tails(float* rows, int width, int stride) {
  if (width >= stride) return;
  for (int i = static_cast<int>(threadIdx.x); i < kAttnTile * stride; i += static_cast<int>(blockDim.x)) {
    if (i % stride >= width) rows[i] = 0.0f;
  }
}

// Folds one round into a warp's running max m, sum l and accumulators. s[j] (j < cnt) comes in as
// this lane's share of position j's dot product; the score is the warp's sum of the shares (the
// bits of block_reduce.cuh's warp_sum, warp_sum16.h) times scale; position j's value row is
// vals + j * stride (shared memory); lane l accumulates dims d = l + 32 a. Positions are folded in
// increasing order: with mn the larger of m and the round's largest score,
//   l = l e^(m - mn) + sum_j e^(s_j - mn),  acc = acc e^(m - mn) + sum_j e^(s_j - mn) v_j.
// The sums end in lanes 2j and 2j + 1, which compute position j's weight for the warp; each weight
// is then shuffled to every lane. Every lane computing every weight (16 expf a round, where a lane
// now computes one) was half of a round's instructions at head_dim 64. The operands and their
// order are those of every lane computing all of them, so are the bits.
// Every accumulator takes every position, without a test against the head's width: the caller's
// value rows must be readable for 32 Acc floats (the accumulators of dims past the head's then
// hold whatever those floats make, and are never written out); a test per dim and row took a
// predicate each, which ptxas kept moving in and out of registers.
template <int Acc>
__device__ inline void warp_fold_round(const float (&s)[kAttnTile], int cnt, float scale, const float* vals, int stride,
                                       float& m, float& l, float (&acc)[Acc]) {
  static_assert(kAttnTile == 16, "a round's scores are reduced sixteen at a time");
  const int lane = threadIdx.x & 31;
  const float own =
      warp_sum16_pairs(s, lane, [](const auto& send, auto& recv, int o) { shfl_xor_n(send, recv, o); }) * scale;
  // The round's largest score: fmaxf from -inf over the staged positions, as a sequential scan
  // gives it (a NaN score is passed over either way); lanes 2j and 2j + 1 hold the same score.
  const float tile_max = warp_butterfly<FmaxOp, 2>((lane >> 1) < cnt ? fmaxf(-INFINITY, own) : -INFINITY);
  const float mn = fmaxf(m, tile_max);
  const float corr = expf(m - mn);  // 0 on the first round (m = -inf); cnt >= 1 keeps mn finite
  const float weight = expf(own - mn);  // position lane / 2's (unused past cnt)
  // Every weight to every lane, unconditionally: a shuffle under the loop's exit would be checked
  // for divergence each time.
  constexpr int kPositionLane[kAttnTile] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  float e[kAttnTile];
  shfl_from_n(weight, kPositionLane, e);
  l *= corr;
#pragma unroll
  for (int a = 0; a < Acc; ++a) acc[a] *= corr;
#pragma unroll
  for (int j = 0; j < kAttnTile; ++j) {
    if (j >= cnt) break;  // cnt is the same in every lane
    l += e[j];
    const float* v = vals + j * stride + lane;
#pragma unroll
    for (int a = 0; a < Acc; ++a) acc[a] += e[j] * v[32 * a];
  }
  m = mn;
}

// ---- Partition states (attention_partitions.h) ----
// Merging a partition (m, l, acc) into the state of the partitions before it (M, L, ACC):
//   M' = max(M, m), L' = L e^(M - M') + l e^(m - M'), ACC' = ACC e^(M - M') + acc e^(m - M').
// Both states are non-empty (a partition holds at least one attended position), so M and m are
// finite. The attention kernels (one block walking every partition) and attention_combine (one
// block per partition) merge with these functions, whose roundings are pinned (no contraction
// choices left to the compiler), so both give the same bits.
struct MergeScale {
  float max, c_old, c_new;
};
__device__ inline MergeScale merge_scale(float M, float m) {
  const float mx = fmaxf(M, m);
  return {mx, expf(M - mx), expf(m - mx)};
}
__device__ inline float merge_value(float old, float v, const MergeScale& s) {
  return __fmaf_rn(old, s.c_old, __fmul_rn(v, s.c_new));
}
// acc / l as acc * (1 / l), both correctly rounded: 1 / l once per row, a product per element.
__device__ inline float reciprocal(float l) { return __fdiv_rn(1.0f, l); }
__device__ inline float normalised(float acc, float inv_l) { return __fmul_rn(acc, inv_l); }

// An output element, and its bf16 rounding in the row's twin where the caller gave one (the rows'
// Activations twin: the next GEMM reads it instead of casting). twin is null or not for the whole
// launch, so the branch is uniform.
__device__ inline void put_output(float* o, uint16_t* twin, int d, float v) {
  o[d] = v;
  if (twin) twin[d] = bf16_bits::from_f32(v);
}

// o[d] = acc / l for the lane's dims (see warp_fold_round); twin: o's twin row or null.
template <int Acc>
__device__ inline void warp_write_normalised(float* o, int width, float l, const float (&acc)[Acc],
                                             uint16_t* twin = nullptr) {
  const int lane = threadIdx.x & 31;
  const float inv = reciprocal(l);
#pragma unroll
  for (int a = 0; a < Acc; ++a) {
    const int d = lane + 32 * a;
    if (d < width) put_output(o, twin, d, normalised(acc[a], inv));
  }
}

// The partitions (attention_partitions.h) a block folds for a token attending [p0, p1]: all of
// them in an unsplit launch; in a split one (gridDim.y > 1) partition k0 + blockIdx.y, none when
// that is past k1. The same for the whole block. Positions are int32 here (fewer registers).
struct PartitionWalk {
  int p0, p1, k0, k1, first, last;
  bool split;
  __device__ bool empty() const { return first > last; }
  // The positions of partition k the token attends to (written so as not to overflow near
  // INT32_MAX).
  __device__ int begin(int k) const { return k * kP > p0 ? k * kP : p0; }
  __device__ int end(int k) const { return k * kP + (p1 - k * kP < kP - 1 ? p1 - k * kP : kP - 1); }
  // Where a split launch puts partition k's state for output row `row` (t * n_heads + h).
  __device__ float* state(float* states, int64_t row, int width, int k) const {
    return split ? states + (row * gridDim.y + (k - k0)) * (width + 2) : nullptr;
  }
  static constexpr int kP = static_cast<int>(kAttnPartition);
};
__device__ inline PartitionWalk partition_walk(int p0, int p1) {
  PartitionWalk w;
  w.p0 = p0;
  w.p1 = p1;
  w.k0 = p0 / PartitionWalk::kP;
  w.k1 = p1 / PartitionWalk::kP;
  w.split = gridDim.y > 1;
  w.first = w.k0 + static_cast<int>(blockIdx.y);
  w.last = w.split ? w.first : w.k1;
  if (w.first > w.k1) w.last = w.first - 1;  // a split block past the token's last partition
  return w;
}

// What a warp does with partition k of its (token, head) once the partition is folded into
// (m, l, acc); st is w.state(...) in a split launch:
//  - the token has one partition: o = acc / l;
//  - split launch: the state goes to st = [m, l, acc[width]] for attention_combine;
//  - unsplit, several partitions: merged into the running state (M, L and the accumulators, kept
//    in o itself: only this lane reads back what it wrote), and o normalised after the last.
// twin (o's twin row, or null) gets the final values' rounding wherever o gets them: a split
// launch's tokens of several partitions get theirs from attention_combine.
template <int Acc>
__device__ inline void warp_finish_partition(int k, const PartitionWalk& w, float* st, float* o, int width, float m,
                                             float l, const float (&acc)[Acc], float& M, float& L,
                                             uint16_t* twin = nullptr) {
  const int lane = threadIdx.x & 31;
  const int k0 = w.k0, k1 = w.k1;
  if (k0 == k1) {
    warp_write_normalised(o, width, l, acc, twin);
    return;
  }
  if (w.split) {
    if (lane == 0) {
      st[0] = m;
      st[1] = l;
    }
#pragma unroll
    for (int a = 0; a < Acc; ++a) {
      const int d = lane + 32 * a;
      if (d < width) st[2 + d] = acc[a];
    }
    return;
  }
  if (k == k0) {  // the first partition is the state as it is
    M = m;
    L = l;
#pragma unroll
    for (int a = 0; a < Acc; ++a) {
      const int d = lane + 32 * a;
      if (d < width) o[d] = acc[a];
    }
    return;
  }
  const MergeScale s = merge_scale(M, m);
  M = s.max;
  L = merge_value(L, l, s);
  const bool last = k == k1;
  const float inv = last ? reciprocal(L) : 1.0f;
#pragma unroll
  for (int a = 0; a < Acc; ++a) {
    const int d = lane + 32 * a;
    if (d < width) {
      const float v = merge_value(o[d], acc[a], s);
      if (last)
        put_output(o, twin, d, normalised(v, inv));
      else
        o[d] = v;
    }
  }
}

}  // namespace shardlm::cuda::detail
