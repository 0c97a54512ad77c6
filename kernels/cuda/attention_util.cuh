// Pieces shared by the paged attention kernels (not part of the launcher interface).
//
// Both kernels give a thread block to one token and a group of up to kAttnHeadsPerBlock query
// heads that read the same cache rows (the query heads of one KV head; MLA: any heads, they all
// read the latent cache), one warp per head. Rounds of kAttnTile positions are staged in shared
// memory by the whole block, so a cache row is read from global memory once per block instead of
// once per head; each warp then scores the round against its own query (lanes split the
// dimensions, warp_sum reduces) and folds it into its running max, sum and accumulators (online
// softmax in fp32, positions in increasing order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda::detail {

constexpr int kAttnTile = 16;          // positions staged per round
constexpr int kAttnHeadsPerBlock = 8;  // warps (query heads) per block at most

// Cache slot of logical position p of a sequence whose physical blocks are listed in bt.
__device__ inline int64_t cache_slot(const int32_t* bt, int64_t p, int64_t block_size) {
  return static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
}

// Folds one round into a warp's running max m, sum l and accumulators: s[j] (j < cnt, the same in
// every lane) are the round's scores and tile_max their maximum; position j's value row is
// vals + j * stride (shared memory); lane l accumulates dims d = l + 32 a (d < width).
template <int Tile, int Acc>
__device__ inline void warp_fold_tile(const float (&s)[Tile], int cnt, float tile_max, const float* vals, int stride,
                                      int width, float& m, float& l, float (&acc)[Acc]) {
  const int lane = threadIdx.x & 31;
  const float mn = fmaxf(m, tile_max);
  const float corr = expf(m - mn);  // 0 on the first round (m = -inf); cnt >= 1 keeps mn finite
  l *= corr;
#pragma unroll
  for (int a = 0; a < Acc; ++a) acc[a] *= corr;
#pragma unroll
  for (int j = 0; j < Tile; ++j) {
    if (j >= cnt) break;  // cnt is the same in every lane
    const float e = expf(s[j] - mn);
    l += e;
    const float* v = vals + j * stride;
#pragma unroll
    for (int a = 0; a < Acc; ++a) {
      const int d = lane + 32 * a;
      if (d < width) acc[a] += e * v[d];
    }
  }
  m = mn;
}

// o[d] = acc / l for the lane's dims (see warp_fold_tile).
template <int Acc>
__device__ inline void warp_write_normalised(float* o, int width, float l, const float (&acc)[Acc]) {
  const int lane = threadIdx.x & 31;
  const float inv = 1.0f / l;
#pragma unroll
  for (int a = 0; a < Acc; ++a) {
    const int d = lane + 32 * a;
    if (d < width) o[d] = acc[a] * inv;
  }
}

}  // namespace shardlm::cuda::detail
