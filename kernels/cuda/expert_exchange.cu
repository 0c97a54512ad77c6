#include "cuda/expert_exchange.h"

#include <cstdint>

namespace shardlm::cuda {

namespace {

constexpr int kMaxThreads = 1024;

int threads_for(int ep) { return ep < 32 ? 32 : (ep + 31) / 32 * 32; }
__device__ inline int kl_of(const ExchangeGeometry& g) { return g.k < g.L ? g.k : g.L; }

// Thread p builds block p: pass 1 keeps the first C tokens with an expert on p (their slots
// insertion-sorted, base[e] counting pairs per local expert), pass 2 numbers the kept pairs in
// (local expert, record) order.
__global__ void expert_send_plan_kernel(ExchangeGeometry g, const int32_t* __restrict__ topk_ids, int64_t T, int64_t t0,
                                        int64_t Ts, const int32_t* __restrict__ pos, int32_t* __restrict__ rec_token,
                                        int32_t* __restrict__ meta, int32_t* __restrict__ pair_row,
                                        int64_t* __restrict__ counts, int32_t* __restrict__ overflow) {
  extern __shared__ int shared[];
  const int L = g.L, k = g.k, kl = kl_of(g);
  const int64_t M = 1 + static_cast<int64_t>(g.C) * kl;
  for (int64_t i = threadIdx.x; i < T * k; i += blockDim.x) pair_row[i] = -1;
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(g.ep) * g.C; i += blockDim.x) rec_token[i] = -1;
  for (int64_t i = threadIdx.x; i < g.ep * M; i += blockDim.x) meta[i] = -1;
  __syncthreads();
  const int p = threadIdx.x;
  if (p >= g.ep) return;
  int* base = shared + p * L;              // [L]
  int* local = shared + g.ep * L + p * k;  // [k]
  int32_t* rec = rec_token + static_cast<int64_t>(p) * g.C;
  int32_t* m = meta + p * M;
  for (int e = 0; e < L; ++e) base[e] = 0;
  int n = 0;
  bool over = false;
  for (int64_t t = t0; t < t0 + Ts; ++t) {
    if (pos && pos[t] < 0) continue;
    int used = 0;
    for (int j = 0; j < k; ++j) {
      const int32_t id = topk_ids[t * k + j];
      const int e = id - p * L;
      if (e < 0 || e >= L) continue;
      if (counts) ++counts[id];
      int at = used++;
      while (at > 0 && local[at - 1] > e) {
        local[at] = local[at - 1];
        --at;
      }
      local[at] = e;
    }
    if (used == 0) continue;
    if (n >= g.C) {
      over = true;
      continue;
    }
    rec[n] = static_cast<int32_t>(t);
    for (int j = 0; j < used; ++j) {
      m[1 + static_cast<int64_t>(n) * kl + j] = local[j];
      ++base[local[j]];
    }
    ++n;
  }
  m[0] = n;
  int run = 0;
  for (int e = 0; e < L; ++e) {
    const int c = base[e];
    base[e] = run;
    run += c;
  }
  for (int i = 0; i < n; ++i) {
    const int64_t t = rec[i];
    for (int j = 0; j < k; ++j) {
      const int e = topk_ids[t * k + j] - p * L;
      if (e < 0 || e >= L) continue;
      const int q = base[e]++;
      if (q < g.Cc) {
        pair_row[t * k + j] = p * g.Cc + q;
      } else {
        over = true;
      }
    }
  }
  if (over) *overflow = 1;
}

// Thread s counts source s's pairs per local expert and how many fit its returned block; then
// threads per local expert lay the owner rows out expert-major; then thread s places its pairs.
__global__ void expert_recv_plan_kernel(ExchangeGeometry g, const int32_t* __restrict__ meta,
                                        int32_t* __restrict__ offsets, int32_t* __restrict__ row_src,
                                        int32_t* __restrict__ back_row) {
  extern __shared__ int shared[];
  const int ep = g.ep, L = g.L, kl = kl_of(g), E = ep * L;
  const int64_t M = 1 + static_cast<int64_t>(g.C) * kl;
  int* kept = shared;            // [ep][L]
  int* first_q = kept + E;       // [ep][L]
  int* first_row = first_q + E;  // [ep][L]
  int* seen = first_row + E;     // [ep][L]
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(ep) * g.Cc; i += blockDim.x) back_row[i] = -1;
  const int s = threadIdx.x;
  int records = 0;
  if (s < ep) {
    const int32_t* m = meta + s * M;
    records = m[0] < 0 ? 0 : (m[0] > g.C ? g.C : m[0]);
    int* cnt = seen + s * L;  // counts first, reset before pass 2
    for (int e = 0; e < L; ++e) cnt[e] = 0;
    for (int i = 0; i < records; ++i)
      for (int j = 0; j < kl; ++j) {
        const int e = m[1 + static_cast<int64_t>(i) * kl + j];
        if (e >= 0 && e < L) ++cnt[e];
      }
    int run = 0;
    for (int e = 0; e < L; ++e) {
      first_q[s * L + e] = run;
      const int room = g.Cc - run;
      kept[s * L + e] = room < 0 ? 0 : (room < cnt[e] ? room : cnt[e]);
      run += cnt[e];
      cnt[e] = 0;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int r = 0;
    for (int e = 0; e < L; ++e) {
      offsets[e] = r;
      for (int src = 0; src < ep; ++src) {
        first_row[src * L + e] = r;
        r += kept[src * L + e];
      }
    }
    offsets[L] = r;
  }
  __syncthreads();
  if (s >= ep) return;
  const int32_t* m = meta + s * M;
  for (int i = 0; i < records; ++i)
    for (int j = 0; j < kl; ++j) {
      const int e = m[1 + static_cast<int64_t>(i) * kl + j];
      if (e < 0 || e >= L) continue;
      const int n = seen[s * L + e]++;
      if (n >= kept[s * L + e]) continue;
      const int row = first_row[s * L + e] + n;
      row_src[row] = s * g.C + i;
      back_row[static_cast<int64_t>(s) * g.Cc + first_q[s * L + e] + n] = row;
    }
}

}  // namespace

size_t expert_send_plan_smem(const ExchangeGeometry& g) {
  return static_cast<size_t>(g.ep) * (g.L + g.k) * sizeof(int);
}
size_t expert_recv_plan_smem(const ExchangeGeometry& g) { return static_cast<size_t>(4) * g.ep * g.L * sizeof(int); }

void launch_expert_send_plan(const ExchangeGeometry& g, const int32_t* topk_ids, int64_t T, int64_t t0, int64_t Ts,
                             const int32_t* pos, int32_t* rec_token, int32_t* meta, int32_t* pair_row, int64_t* counts,
                             int32_t* overflow, cudaStream_t stream) {
  if (g.ep <= 0 || g.ep > kMaxThreads) return;
  expert_send_plan_kernel<<<1, threads_for(g.ep), expert_send_plan_smem(g), stream>>>(
      g, topk_ids, T, t0, Ts, pos, rec_token, meta, pair_row, counts, overflow);
}

void launch_expert_recv_plan(const ExchangeGeometry& g, const int32_t* meta, int32_t* offsets, int32_t* row_src,
                             int32_t* back_row, cudaStream_t stream) {
  if (g.ep <= 0 || g.ep > kMaxThreads) return;
  expert_recv_plan_kernel<<<1, threads_for(g.ep), expert_recv_plan_smem(g), stream>>>(g, meta, offsets, row_src,
                                                                                      back_row);
}

}  // namespace shardlm::cuda
