#include "cuda/expert_exchange.h"
#include "cuda/expert_rows.h"

#include <cstdint>

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 256;  // a tile of 256 tokens or records per step
constexpr int kWarps = kThreads / 32;

// The exclusive rank of this lane among the warp's lanes with `on` set (meaningful where it is
// set), and how many are set (every lane). All 32 lanes take part.
__device__ inline void warp_rank(bool on, int lane, int* rank, int* count) {
  const unsigned same = __match_any_sync(0xffffffffu, on ? 1 : 0);  // the lanes agreeing with this one
  const unsigned set = on ? same : ~same;
  *rank = __popc(set & ((1u << lane) - 1u));
  *count = __popc(set);
}

// Numbering of keys within a tile, in thread order: each thread marks the local experts it holds
// (at most one slot per expert and record) in its warp's bit masks; afterwards, for a key e of
// thread i, before[e] + warp_base[warp][e] + (lanes below i in its warp holding e) is its rank
// among the tile's and the earlier tiles' holders of e, and before[e] moves past the tile. The
// caller runs rank_slots() from every thread, then reads rank().
struct TileRanks {
  unsigned* masks;  // [kWarps][L]
  int* warp_base;   // [kWarps][L]
  int* before;      // [L] holders in earlier tiles
  int L;

  __device__ void clear() {
    for (int x = threadIdx.x; x < kWarps * L; x += blockDim.x) masks[x] = 0u;
  }
  __device__ void mark(int e) { atomicOr(&masks[(threadIdx.x >> 5) * L + e], 1u << (threadIdx.x & 31)); }
  __device__ void settle() {
    for (int e = threadIdx.x; e < L; e += blockDim.x) {
      int run = before[e];
      for (int w = 0; w < kWarps; ++w) {
        warp_base[w * L + e] = run;
        run += __popc(masks[w * L + e]);
      }
      before[e] = run;
    }
  }
  // clear, mark and settle over one tile: this thread's record holds the local experts slots[0..kl)
  // (-1 padded) when `valid`. Every thread of the block calls it.
  __device__ void rank_slots(const int32_t* slots, bool valid, int kl) {
    clear();
    __syncthreads();
    if (valid)
      for (int s = 0; s < kl; ++s)
        if (slots[s] >= 0 && slots[s] < L) mark(slots[s]);
    __syncthreads();
    settle();
    __syncthreads();
  }
  __device__ int rank(int e) const {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    return warp_base[w * L + e] + __popc(masks[w * L + e] & ((1u << lane) - 1u));
  }
};

__device__ inline int kl_of(const ExchangeGeometry& g) { return g.k < g.L ? g.k : g.L; }

// Block p's meta: its rows from C on, as int32 (kernels/cpu/expert_exchange.h's block_meta).
__device__ inline int64_t meta_at(const ExchangeGeometry& g, int p) {
  return (static_cast<int64_t>(p) * g.R + g.C) * g.H;
}

// Block p builds block p. The share: of the real rows [0, n), n = 1 + the last row with pos >= 0,
// tp rank share_rank's part. Records: the share's tokens in tiles, each thread one token; a token
// with experts on p takes the next record (a block-wide scan of the flags), its slots written
// ascending. Pairs: the kept records in tiles, each thread one record; a pair's q is its
// expert's base (the kept pairs of lower local experts) + its rank among the expert's holders.
__global__ void __launch_bounds__(kThreads)
    expert_send_plan_kernel(ExchangeGeometry g, const int32_t* __restrict__ topk_ids, int64_t T, int share_rank,
                            int share_size, const int32_t* __restrict__ pos, int32_t* __restrict__ rec_token,
                            float* __restrict__ blocks, int32_t* __restrict__ pair_row, int64_t* __restrict__ counts,
                            int32_t* __restrict__ overflow) {
  extern __shared__ int shared[];
  const int L = g.L, k = g.k, kl = kl_of(g), p = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t meta_words = static_cast<int64_t>(g.R - g.C) * g.H;  // the meta, -1 padded
  int* all = shared;          // [L] the share's pairs per local expert
  int* kept = all + L;        // [L] the kept records' pairs per local expert, then their bases
  int* warp_base = kept + L;  // [kWarps][L]
  unsigned* masks = reinterpret_cast<unsigned*>(warp_base + kWarps * L);  // [kWarps][L]
  __shared__ int warp_count[kWarps];
  __shared__ int records;  // records so far
  __shared__ int over;
  __shared__ int real;  // 1 + the last real row
  if (tid == 0) real = pos ? 0 : static_cast<int>(T);
  __syncthreads();
  if (pos) {
    int last = 0;
    for (int64_t t = tid; t < T; t += blockDim.x)
      if (pos[t] >= 0) last = static_cast<int>(t) + 1;
    if (last > 0) atomicMax(&real, last);
    __syncthreads();
  }
  const int64_t t0 = static_cast<int64_t>(real) * share_rank / share_size,
                Ts = static_cast<int64_t>(real) * (share_rank + 1) / share_size - t0;
  int32_t* rec = rec_token + static_cast<int64_t>(p) * g.R;
  int32_t* m = reinterpret_cast<int32_t*>(blocks + meta_at(g, p));
  // Block 0 also clears the pairs no block owns: tokens outside the share, padding tokens and
  // expert ids outside [0, ep * L).
  for (int64_t i = tid; i < T * k; i += blockDim.x) {
    const int64_t t = i / k;
    const bool in_share = t >= t0 && t < t0 + Ts && !(pos && pos[t] < 0);
    const int id = topk_ids[i];
    const int owner = in_share && id >= 0 && id < g.ep * L ? id / L : -1;
    if (owner == p || (owner < 0 && p == 0)) pair_row[i] = -1;
  }
  for (int i = tid; i < g.R; i += blockDim.x) rec[i] = i < g.C ? -1 : kKeepRow;
  for (int64_t i = tid; i < meta_words; i += blockDim.x) m[i] = -1;
  for (int e = tid; e < L; e += blockDim.x) all[e] = kept[e] = 0;
  if (tid == 0) records = over = 0;
  __syncthreads();

  for (int64_t tile = 0; tile < Ts; tile += kThreads) {
    const int64_t t = t0 + tile + tid;
    int used = 0;
    if (tile + tid < Ts && !(pos && pos[t] < 0)) {
      for (int j = 0; j < k; ++j) {
        const int e = topk_ids[t * k + j] - p * L;
        if (e >= 0 && e < L) {
          ++used;
          atomicAdd(&all[e], 1);
        }
      }
    }
    int r = 0, n = 0;
    warp_rank(used > 0, lane, &r, &n);
    if (lane == 0) warp_count[warp] = n;
    __syncthreads();
    int base = records;
    for (int w = 0; w < warp; ++w) base += warp_count[w];
    const int at = base + r;
    if (used > 0 && at >= g.C) over = 1;
    if (used > 0 && at < g.C) {
      rec[at] = static_cast<int32_t>(t);
      // The token's experts on p ascending: the smallest above the last one written.
      int last = -1;
      for (int s = 0; s < used; ++s) {
        int pick = L;
        for (int j = 0; j < k; ++j) {
          const int e = topk_ids[t * k + j] - p * L;
          if (e > last && e < pick) pick = e;
        }
        m[1 + static_cast<int64_t>(at) * kl + s] = pick;
        atomicAdd(&kept[pick], 1);
        last = pick;
      }
    }
    __syncthreads();
    if (tid == 0) {
      for (int w = 0; w < kWarps; ++w) records += warp_count[w];
    }
    __syncthreads();
  }
  const int n_rec = records < g.C ? records : g.C;
  if (tid == 0) {
    m[0] = n_rec;
    int run = 0;  // kept[] becomes each local expert's first q
    for (int e = 0; e < L; ++e) {
      const int c = kept[e];
      kept[e] = run;
      run += c;
    }
  }
  if (counts)
    for (int e = tid; e < L; e += blockDim.x) counts[p * L + e] += all[e];
  __syncthreads();

  // The pairs' q in (local expert, record) order: a tile's holders of each expert are ranked from
  // the expert's running base.
  TileRanks ranks{masks, warp_base, kept, L};
  for (int tile = 0; tile < n_rec; tile += kThreads) {
    const int i = tile + tid;
    ranks.rank_slots(m + 1 + static_cast<int64_t>(i) * kl, i < n_rec, kl);
    if (i < n_rec) {
      const int64_t t = rec[i];
      for (int j = 0; j < k; ++j) {
        const int e = topk_ids[t * k + j] - p * L;
        if (e < 0 || e >= L) continue;
        const int q = ranks.rank(e);
        if (q < g.Cc) {
          pair_row[t * k + j] = p * g.Cc + q;
        } else {
          over = 1;
        }
      }
    }
    __syncthreads();
  }
  if (tid == 0 && over) *overflow = 1;
}

// One block. Counts per (source, local expert) over every received pair; per source the first q
// of each expert and how many fit its returned block; the owner rows expert-major, then source;
// then each source's records in tiles, a pair's row its (source, expert) run's start + its rank
// among the run's holders.
__global__ void __launch_bounds__(kThreads)
    expert_recv_plan_kernel(ExchangeGeometry g, const float* __restrict__ blocks, int32_t* __restrict__ offsets,
                            int32_t* __restrict__ row_src, int32_t* __restrict__ back_row) {
  extern __shared__ int shared[];
  const int ep = g.ep, L = g.L, kl = kl_of(g), E = ep * L, tid = threadIdx.x;
  auto meta_of = [&](int s) { return reinterpret_cast<const int32_t*>(blocks + meta_at(g, s)); };
  int* kept = shared;            // [ep][L] pairs per (source, expert), then how many are kept
  int* first_q = kept + E;       // [ep][L]
  int* first_row = first_q + E;  // [ep][L]
  int* before = first_row + E;   // [L]
  int* warp_base = before + L;   // [kWarps][L]
  unsigned* masks = reinterpret_cast<unsigned*>(warp_base + kWarps * L);  // [kWarps][L]
  auto records = [&](int s) {
    const int n = meta_of(s)[0];
    return n < 0 ? 0 : (n > g.C ? g.C : n);
  };
  for (int64_t i = tid; i < static_cast<int64_t>(ep) * g.Cc; i += blockDim.x) back_row[i] = -1;
  for (int x = tid; x < E; x += blockDim.x) kept[x] = 0;
  __syncthreads();
  const int64_t per_source = static_cast<int64_t>(g.C) * kl;
  for (int64_t x = tid; x < ep * per_source; x += blockDim.x) {
    const int s = static_cast<int>(x / per_source);
    const int64_t slot = x % per_source;
    if (slot / kl >= records(s)) continue;
    const int e = meta_of(s)[1 + slot];
    if (e >= 0 && e < L) atomicAdd(&kept[s * L + e], 1);
  }
  __syncthreads();
  for (int s = tid; s < ep; s += blockDim.x) {
    int run = 0;
    for (int e = 0; e < L; ++e) {
      const int c = kept[s * L + e], room = g.Cc - run;
      first_q[s * L + e] = run;
      kept[s * L + e] = room < 0 ? 0 : (room < c ? room : c);
      run += c;
    }
  }
  __syncthreads();
  for (int e = tid; e < L; e += blockDim.x) {  // rows within expert e, source by source
    int run = 0;
    for (int s = 0; s < ep; ++s) {
      first_row[s * L + e] = run;
      run += kept[s * L + e];
    }
    before[e] = run;
  }
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int e = 0; e < L; ++e) {
      const int c = before[e];
      offsets[e] = run;
      before[e] = run;
      run += c;
    }
    offsets[L] = run;
  }
  __syncthreads();
  for (int x = tid; x < E; x += blockDim.x) first_row[x] += before[x % L];
  __syncthreads();

  TileRanks ranks{masks, warp_base, before, L};
  for (int s = 0; s < ep; ++s) {
    const int n_rec = records(s);
    for (int e = tid; e < L; e += blockDim.x) before[e] = 0;
    for (int tile = 0; tile < n_rec; tile += kThreads) {
      const int i = tile + tid;
      const int32_t* slots = meta_of(s) + 1 + static_cast<int64_t>(i) * kl;
      ranks.rank_slots(slots, i < n_rec, kl);
      if (i < n_rec)
        for (int j = 0; j < kl; ++j) {
          const int e = slots[j];
          if (e < 0 || e >= L) continue;
          const int n = ranks.rank(e);
          if (n >= kept[s * L + e]) continue;
          const int row = first_row[s * L + e] + n;
          row_src[row] = s * g.R + i;
          back_row[static_cast<int64_t>(s) * g.Cc + first_q[s * L + e] + n] = row;
        }
      __syncthreads();
    }
    __syncthreads();  // before[] is reset for the next source
  }
}

}  // namespace

size_t expert_send_plan_smem(const ExchangeGeometry& g) {
  return static_cast<size_t>(2 + 2 * kWarps) * g.L * sizeof(int);
}
size_t expert_recv_plan_smem(const ExchangeGeometry& g) {
  return (static_cast<size_t>(3) * g.ep * g.L + static_cast<size_t>(1 + 2 * kWarps) * g.L) * sizeof(int);
}

void launch_expert_send_plan(const ExchangeGeometry& g, const int32_t* topk_ids, int64_t T, int share_rank,
                             int share_size, const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row,
                             int64_t* counts, int32_t* overflow, cudaStream_t stream) {
  if (g.ep <= 0 || g.L <= 0) return;
  expert_send_plan_kernel<<<g.ep, kThreads, expert_send_plan_smem(g), stream>>>(
      g, topk_ids, T, share_rank, share_size, pos, rec_token, blocks, pair_row, counts, overflow);
}

void launch_expert_recv_plan(const ExchangeGeometry& g, const float* blocks, int32_t* offsets, int32_t* row_src,
                             int32_t* back_row, cudaStream_t stream) {
  if (g.ep <= 0 || g.L <= 0) return;
  expert_recv_plan_kernel<<<1, kThreads, expert_recv_plan_smem(g), stream>>>(g, blocks, offsets, row_src, back_row);
}

}  // namespace shardlm::cuda
