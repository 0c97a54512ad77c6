#include "cuda/moe_topk.h"

#include <cstdint>

#include "cuda/block_reduce.cuh"
#include "cuda/block_reduce_wide.cuh"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 128;

// The host's selection key: NaN ranks below everything (as -inf).
__device__ inline float select_key(float v) { return isnan(v) ? -INFINITY : v; }

// a (index ia) ranks before b (index ib): larger key, ties to the lower index.
__device__ inline bool better(float a, int ia, float b, int ib) {
  const float ka = select_key(a), kb = select_key(b);
  return ka > kb || (ka == kb && ia < ib);
}

// A 64-bit key whose minimum over a set is the best element by the host's order: the key's
// bits flipped so that larger floats give smaller integers, then the index (ties to the lower).
__device__ inline unsigned long long rank_key(float v, int idx) {
  v = select_key(v);
  if (v == 0.0f) v = 0.0f;  // -0 and +0 compare equal on the host: one key for both
  const uint32_t u = __float_as_uint(v);
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(~ascending) << 32) | static_cast<uint32_t>(idx);
}

template <bool kSigmoid>
__global__ void moe_topk_kernel(const float* __restrict__ logits, int64_t T, int E, int k,
                                const float* __restrict__ bias, int n_group, int topk_group, bool norm, float scale,
                                int32_t* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ float smem[];
  float* s = smem;                                     // [E] probability / sigmoid score
  float* choice = s + E;                               // [E] selection score
  int* eligible = reinterpret_cast<int*>(choice + E);  // [E] 1: may still be chosen
  int* chosen = eligible + E;                          // [k]
  float* gscore = reinterpret_cast<float*>(chosen + k);  // [n_group]
  int* kept = reinterpret_cast<int*>(gscore + n_group);  // [n_group]
  __shared__ float denom_shared;
  const int tid = threadIdx.x, nt = blockDim.x;

  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* x = logits + t * E;
    if constexpr (!kSigmoid) {
      float mx = -INFINITY;
      for (int e = tid; e < E; e += nt) mx = fmaxf(mx, x[e]);
      mx = block_max(mx);
      for (int e = tid; e < E; e += nt) s[e] = static_cast<float>(exp(static_cast<double>(x[e] - mx)));
      __syncthreads();
      // The host's sum: fp64, in index order, rounded once to fp32.
      if (tid == 0) {
        double sum = 0;
        for (int e = 0; e < E; ++e) sum += s[e];
        denom_shared = static_cast<float>(sum);
      }
      __syncthreads();
      const float fsum = denom_shared;
      for (int e = tid; e < E; e += nt) {
        s[e] = s[e] / fsum;
        choice[e] = s[e];
        eligible[e] = 1;
      }
      __syncthreads();
    } else {
      for (int e = tid; e < E; e += nt) {
        s[e] = 1.0f / (1.0f + static_cast<float>(exp(-static_cast<double>(x[e]))));
        choice[e] = bias ? s[e] + bias[e] : s[e];
        eligible[e] = 1;
      }
      __syncthreads();
      if (topk_group < n_group) {
        const int gsize = E / n_group;
        for (int g = tid; g < n_group; g += nt) {
          float a = -INFINITY, b = -INFINITY;  // largest, second largest
          for (int j = 0; j < gsize; ++j) {
            const float v = select_key(choice[g * gsize + j]);
            if (v > a) {
              b = a;
              a = v;
            } else if (v > b) {
              b = v;
            }
          }
          gscore[g] = gsize >= 2 ? a + b : a;
          kept[g] = 0;
        }
        __syncthreads();
        if (tid == 0) {
          for (int r = 0; r < topk_group; ++r) {
            int best = -1;
            for (int g = 0; g < n_group; ++g)
              if (!kept[g] && (best < 0 || better(gscore[g], g, gscore[best], best))) best = g;
            kept[best] = 1;
          }
        }
        __syncthreads();
        for (int e = tid; e < E; e += nt) eligible[e] = kept[e / gsize];
        __syncthreads();
      }
    }

    for (int j = 0; j < k; ++j) {
      unsigned long long best = ~0ULL;
      for (int e = tid; e < E; e += nt)
        if (eligible[e]) best = min(best, rank_key(choice[e], e));
      best = block_min_u64(best);  // synchronises: every thread has read eligible[]
      if (tid == 0) {
        const int e = best == ~0ULL ? 0 : static_cast<int>(best & 0xffffffffu);
        chosen[j] = e;
        eligible[e] = 0;
      }
      __syncthreads();
    }

    if (tid == 0) {
      int32_t* ex = ids + t * k;
      float* w = weights + t * k;
      double sum = 0;
      for (int j = 0; j < k; ++j) {
        ex[j] = chosen[j];
        w[j] = s[chosen[j]];
        sum += w[j];
      }
      const float denom = kSigmoid ? static_cast<float>(sum + 1e-20) : static_cast<float>(sum);
      for (int j = 0; j < k; ++j) {
        if (norm) w[j] = w[j] / denom;
        w[j] = w[j] * scale;
      }
    }
    __syncthreads();  // the next token overwrites the shared arrays
  }
}

int grid_for(int64_t T) { return static_cast<int>(T < 65535 * 16 ? T : 65535 * 16); }

size_t smem_bytes(int E, int k, int n_group) {
  return static_cast<size_t>(3 * E + k + 2 * n_group) * 4;
}

// Beyond about 4000 experts the arrays pass the default 48 KiB (less the block reductions' static
// shared memory): the kernel opts in to what the launch takes (a failure shows at launch).
template <bool kSigmoid>
void allow_shared(size_t bytes) {
  if (bytes + 1024 > 48 * 1024)
    cudaFuncSetAttribute(moe_topk_kernel<kSigmoid>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(bytes));
}

}  // namespace

void launch_moe_topk_softmax(const float* logits, int64_t T, int E, int k, bool renormalise, double scale,
                             int32_t* ids, float* weights, cudaStream_t stream) {
  if (T <= 0 || E <= 0 || k <= 0) return;
  allow_shared<false>(smem_bytes(E, k, 0));
  moe_topk_kernel<false><<<grid_for(T), kThreads, smem_bytes(E, k, 0), stream>>>(
      logits, T, E, k, nullptr, 1, 1, renormalise, static_cast<float>(scale), ids, weights);
}

void launch_moe_topk_sigmoid(const float* logits, int64_t T, int E, int k, const float* bias, int n_group,
                             int topk_group, bool norm_topk_prob, double routed_scaling_factor, int32_t* ids,
                             float* weights, cudaStream_t stream) {
  if (T <= 0 || E <= 0 || k <= 0) return;
  allow_shared<true>(smem_bytes(E, k, n_group));
  moe_topk_kernel<true><<<grid_for(T), kThreads, smem_bytes(E, k, n_group), stream>>>(
      logits, T, E, k, bias, n_group, topk_group, norm_topk_prob, static_cast<float>(routed_scaling_factor), ids,
      weights);
}

}  // namespace shardlm::cuda
