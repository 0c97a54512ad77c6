#include "cuda/sampling.h"

#include <cstdint>

#include "cuda/block_reduce.cuh"
#include "cuda/block_reduce_wide.cuh"
#include "philox.h"
#include "sample_rules.h"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 512;
using u64 = unsigned long long;

// The position of token j in the candidate order: smaller is earlier (NaN as -inf, -0 as +0).
__device__ inline u64 order_key(float v, int64_t j) {
  return sampling::candidate_key(v, static_cast<uint32_t>(j));
}

// log_softmax(x)[i] as the host computes it (log_softmax_at): fp32 max, fp64 sum of exp(x - max)
// (the host's exponentials are fp32 within 1 ulp, these fp64: the results differ by about 1e-7).
struct RowNorm {
  float mx;
  double sum;
  __device__ float log_softmax(float xi) const { return static_cast<float>(static_cast<double>(xi) - mx - log(sum)); }
};

__device__ RowNorm row_norm(const float* x, int64_t V) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx);
  double sum = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += exp(static_cast<double>(x[j]) - mx);
  sum = block_sum_f64(sum);
  return {mx, sum};
}

__device__ float log_softmax_at(const float* x, int64_t V, int64_t i) { return row_norm(x, V).log_softmax(x[i]); }

// The row's n first candidates (kernels/cpu/logits_scan.h's top_logprobs): pass k takes the
// smallest key above pass k-1's, so a tie between equal logits goes to the lower id as on the host.
__device__ void write_top(const float* x, int64_t V, const RowNorm& norm, int32_t n, int32_t* ids, float* lps) {
  u64 prev = 0;
  for (int32_t k = 0; k < n; ++k) {
    u64 best = ~0ull;  // no token has this key (NaN ranks as -inf, whose key is below)
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const u64 key = order_key(x[j], j);
      if (!isnan(x[j]) && (k == 0 || key > prev)) best = min(best, key);
    }
    best = block_min_u64(best);
    if (threadIdx.x == 0) {
      const int64_t id = static_cast<int64_t>(best & 0xffffffffull);
      ids[k] = best == ~0ull ? -1 : static_cast<int32_t>(id);
      lps[k] = best == ~0ull ? NAN : norm.log_softmax(x[id]);
    }
    prev = best;
  }
}

// Over the tokens whose order key is <= q: their count, or the sum of their weights
// (sampling::weight of the probabilities p): exact integers, the same in any order of addition.
__device__ long long prefix_count(const float* x, int64_t V, u64 q) {
  long long n = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) n += order_key(x[j], j) <= q ? 1 : 0;
  return block_sum_i64(n);
}

__device__ long long prefix_weight(const float* x, const float* p, int64_t V, u64 q) {
  long long w = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    if (order_key(x[j], j) <= q) w += sampling::weight(p[j]);
  }
  return block_sum_i64(w);
}

// The smallest token key q in [lo, hi] (both token keys, pred(hi) true) with pred(q) true, pred
// monotone in q. First the logit half of the key, then, among the tokens sharing that logit, the
// id half. Every thread must call it; pred must return the same value on every thread.
template <typename Pred>
__device__ u64 search_key(const float* x, int64_t V, u64 lo, u64 hi, Pred pred) {
  uint32_t klo = static_cast<uint32_t>(lo >> 32), khi = static_cast<uint32_t>(hi >> 32);
  while (klo < khi) {
    const uint32_t mid = klo + (khi - klo) / 2;
    if (pred((static_cast<u64>(mid) << 32) | 0xffffffffull)) {
      khi = mid;
    } else {
      klo = mid + 1;
    }
  }
  // The ids of the tokens with this logit key: the answer is one of them.
  u64 id_lo = ~0ull, id_hi = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const u64 key = order_key(x[j], j);
    if (static_cast<uint32_t>(key >> 32) == klo) {
      id_lo = min(id_lo, static_cast<u64>(j));
      id_hi = max(id_hi, static_cast<u64>(j));
    }
  }
  id_lo = block_min_u64(id_lo);
  id_hi = block_max_u64(id_hi);
  const u64 high = static_cast<u64>(klo) << 32;
  while (id_lo < id_hi) {
    const u64 mid = id_lo + (id_hi - id_lo) / 2;
    if (pred(high | mid)) {
      id_hi = mid;
    } else {
      id_lo = mid + 1;
    }
  }
  return high | id_lo;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, const float* __restrict__ choice_logits, int64_t R, int64_t V,
                  const SamplingRow* __restrict__ params, float* __restrict__ scratch, int32_t* __restrict__ tokens,
                  float* __restrict__ logprobs, int32_t* __restrict__ top_tokens, float* __restrict__ top_logprobs) {
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const float* x = choice_logits + row * V;  // what the choice reads; the logprob reads the raw row
    float* p = scratch + row * V;
    const SamplingRow sp = params[row];

    // The first candidate (the host's argmax: ties to the lowest id) and the last.
    u64 best = ~0ull, worst = 0;
    for (int64_t j = tid; j < V; j += nt) {
      const u64 key = order_key(x[j], j);
      if (!isnan(x[j])) best = min(best, key);
      worst = max(worst, key);
    }
    best = block_min_u64(best);
    worst = block_max_u64(worst);

    // The host's argmax: the first of the largest logits above -inf, NaN never; 0 when there is none.
    const int64_t best_id = static_cast<int64_t>(best & 0xffffffffull);
    const int64_t greedy = (best == ~0ull || x[best_id] == -INFINITY) ? 0 : best_id;
    const double inv_t = 1.0 / sp.temperature;
    int64_t token = greedy;
    if (sp.target >= 0) {
      token = sp.target;  // a scored row: its given token, nothing drawn
    } else if (sp.temperature > 0.0 && best != ~0ull && isfinite(x[best_id]) && isfinite(inv_t)) {
      const double top = x[best_id];
      for (int64_t j = tid; j < V; j += nt) {
        p[j] = isnan(x[j]) ? 0.0f : static_cast<float>(exp((x[j] - top) * inv_t));  // NaN weighs nothing
      }
      __syncthreads();

      u64 last = worst;  // key of the last candidate kept so far
      if (sp.top_k > 0 && sp.top_k < V) {
        const long long k = sp.top_k;
        last = search_key(x, V, best, last, [&](u64 q) { return prefix_count(x, V, q) >= k; });
      }
      if (sp.min_p > 0.0) {
        const double cutoff = sp.min_p * static_cast<double>(p[best_id]);  // p of the first is 1
        u64 keep = best;  // the first candidate always stays
        for (int64_t j = tid; j < V; j += nt) {
          const u64 key = order_key(x[j], j);
          if (key <= last && p[j] >= cutoff) keep = max(keep, key);
        }
        last = block_max_u64(keep);
      }
      // top-p last, over what top-k and min-p left (vLLM's order), as the host sampler.
      if (sp.top_p < 1.0) {
        const double target = sp.top_p * static_cast<double>(prefix_weight(x, p, V, last));
        last = search_key(x, V, best, last,
                          [&](u64 q) { return static_cast<double>(prefix_weight(x, p, V, q)) >= target; });
      }
      const long long mass = prefix_weight(x, p, V, last);
      const double u = static_cast<double>(rng::uniform_at(sp.seed, static_cast<uint64_t>(sp.position))) *
                       static_cast<double>(mass);
      // The first candidate whose cumulative weight exceeds u (mass > u: the first weighs 2^40).
      const u64 pick =
          search_key(x, V, best, last, [&](u64 q) { return static_cast<double>(prefix_weight(x, p, V, q)) > u; });
      token = static_cast<int64_t>(pick & 0xffffffffull);
    }
    const float* raw = logits + row * V;
    const RowNorm norm = row_norm(raw, V);
    if (tid == 0) {
      tokens[row] = static_cast<int32_t>(token);
      logprobs[row] = norm.log_softmax(raw[token]);
    }
    if (sp.top_n > 0) write_top(raw, V, norm, sp.top_n, top_tokens + sp.top_begin, top_logprobs + sp.top_begin);
    __syncthreads();  // p[] of this row is read until here
  }
}

__global__ void __launch_bounds__(kThreads)
    logprobs_kernel(const float* __restrict__ logits, int64_t R, int64_t V, const int32_t* __restrict__ tokens,
                    float* __restrict__ logprobs) {
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const float lp = log_softmax_at(logits + row * V, V, tokens[row]);
    if (threadIdx.x == 0) logprobs[row] = lp;
  }
}

int grid_for(int64_t rows) { return static_cast<int>(rows < 65535 * 16 ? rows : 65535 * 16); }

}  // namespace

void launch_sample(const float* logits, int64_t R, int64_t V, const SamplingRow* params, float* scratch,
                   int32_t* tokens, float* logprobs, cudaStream_t stream, const float* choice_logits,
                   int32_t* top_tokens, float* top_logprobs) {
  if (R <= 0 || V <= 0) return;
  sample_kernel<<<grid_for(R), kThreads, 0, stream>>>(logits, choice_logits ? choice_logits : logits, R, V, params,
                                                      scratch, tokens, logprobs, top_tokens, top_logprobs);
}

void launch_logprobs(const float* logits, int64_t R, int64_t V, const int32_t* tokens, float* logprobs,
                     cudaStream_t stream) {
  if (R <= 0 || V <= 0) return;
  logprobs_kernel<<<grid_for(R), kThreads, 0, stream>>>(logits, R, V, tokens, logprobs);
}

}  // namespace shardlm::cuda
