// Pieces shared by the paged attention kernels (not part of the launcher interface).
#pragma once

#include <cstdint>

namespace shardlm::cuda::detail {

// Positions scored per round of the online softmax: their scores and cache rows are staged in
// shared memory, then every thread folds the round into its running max, sum and accumulators.
constexpr int kAttnChunk = 32;

// Cache slot of logical position p of a sequence whose physical blocks are listed in bt.
__device__ inline int64_t cache_slot(const int32_t* bt, int64_t p, int64_t block_size) {
  return static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
}

}  // namespace shardlm::cuda::detail
