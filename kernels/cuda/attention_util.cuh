// Pieces shared by the paged attention kernels (not part of the launcher interface).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda::detail {

// Positions scored per round of the online softmax: their scores and cache rows are staged in
// shared memory, then every thread folds the round into its running max, sum and accumulators.
constexpr int kAttnChunk = 32;

// Cache slot of logical position p of a sequence whose physical blocks are listed in bt.
__device__ inline int64_t cache_slot(const int32_t* bt, int64_t p, int64_t block_size) {
  return static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
}

// Folds one round of cnt staged scores sc[j] (rows[j]: the offset of position j's value row in
// values) into the running max m and sum l and into this thread's output dims
// d = threadIdx.x + a * Threads (a < Acc, d < width). Every thread of the block runs it with the
// same scores, so all agree on m and l.
template <int Threads, int Acc>
__device__ inline void fold_round(const float* sc, const int64_t* rows, int cnt, const float* values, int64_t width,
                                  float& m, float& l, float (&acc)[Acc]) {
  float cm = m;
  for (int j = 0; j < cnt; ++j) cm = fmaxf(cm, sc[j]);
  const float corr = expf(m - cm);  // 0 on the first round (m = -inf)
  l *= corr;
#pragma unroll
  for (int a = 0; a < Acc; ++a) acc[a] *= corr;
  for (int j = 0; j < cnt; ++j) {
    const float e = expf(sc[j] - cm);
    l += e;
    const float* v = values + rows[j];
#pragma unroll
    for (int a = 0; a < Acc; ++a) {
      const int64_t d = threadIdx.x + a * Threads;
      if (d < width) acc[a] += e * v[d];
    }
  }
  m = cm;
}

// o[d] = acc / l for this thread's dims (see fold_round).
template <int Threads, int Acc>
__device__ inline void write_normalised(float* o, int64_t width, float l, const float (&acc)[Acc]) {
  const float inv = 1.0f / l;
#pragma unroll
  for (int a = 0; a < Acc; ++a) {
    const int64_t d = threadIdx.x + a * Threads;
    if (d < width) o[d] = acc[a] * inv;
  }
}

}  // namespace shardlm::cuda::detail
