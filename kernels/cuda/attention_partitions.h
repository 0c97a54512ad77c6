// Position partitions of the paged attention kernels (paged_attention.h, latent_attention.h).
//
// A token's attended positions [p0, p1] are cut at the multiples of kAttnPartition. Each partition
// is folded into a state of its own (online-softmax max m, sum l and accumulators), and the states
// are merged in partition order by one fixed sequence of rounded operations. So whether one thread
// block walks all of a token's partitions, merging as it goes, or each partition gets a block that
// writes its state and attention_combine merges them, is a launch choice that changes no bit of
// the result: a token's output depends on its own query, positions and cache only, not on what
// else the step holds or whether the step runs from a captured graph.
//
// The split launch is what keeps the device busy when a step has few (token, head group) pairs and
// long contexts, e.g. decoding one sequence of 32k positions on a tp shard with one KV head: one
// block walking 32k positions leaves the other multiprocessors idle, 128 blocks of 256 do not.
//
// Plain C++ (no CUDA headers): the backend's launch choice is made, and tested, on the host.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace shardlm::cuda {

// Positions per partition: a multiple of the kernels' staged round (kAttnTile), and long enough
// that a partition's block streams its rows for longer than its state takes to write and merge.
// On an H200 (64-dim GQA, bf16 cache, rounds staged ahead), 512, 256 and 128 took 78, 47 and 38 us
// for one token at 4096 positions and 768, 809 and 893 us for 8 at 32768: 256 gives the lone
// token most of the gain for 5% at the long batch (the merge has twice the states).
constexpr int64_t kAttnPartition = 256;

// First attended position of a token at pos (window <= 0: no sliding window).
SHARDLM_HD inline int64_t attention_first_position(int64_t pos, int64_t window) {
  if (window <= 0) return 0;
  return pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// Partitions a token at pos attends to; 0 for a padding token (pos < 0).
SHARDLM_HD inline int64_t attention_partitions(int64_t pos, int64_t window) {
  if (pos < 0) return 0;
  return pos / kAttnPartition - attention_first_position(pos, window) / kAttnPartition + 1;
}

// The most partitions any token at a position up to max_pos attends to (0 when max_pos < 0): a
// window of w positions spans at most ceil((w - 1) / kAttnPartition) + 1 of them.
inline int64_t attention_max_partitions(int64_t max_pos, int64_t window) {
  if (max_pos < 0) return 0;
  const int64_t all = max_pos / kAttnPartition + 1;
  if (window <= 0) return all;
  const int64_t span = (window - 1 + kAttnPartition - 1) / kAttnPartition + 1;
  return span < all ? span : all;
}

// A split launch: `parts` blocks along grid y per (token, head group), block y taking the token's
// partition y (counted from its first; blocks past its last do nothing), and `states` the device
// scratch [T, n_heads, parts, width + 2] floats, (m, l, accumulators) per partition. parts <= 1:
// no split (states unused).
struct AttentionSplit {
  int64_t parts = 1;
  float* states = nullptr;
};

// Size of a split launch's states in floats.
inline int64_t attention_split_floats(int64_t T, int64_t n_heads, int64_t width, int64_t parts) {
  return T * n_heads * parts * (width + 2);
}

// The launch choice. An unsplit launch has `blocks` thread blocks, each walking all partitions of
// its token; split, block count times the most partitions any token has (`max_parts`). Split when
// some token has more than one partition and the unsplit grid is under kSplitBelowBlocksPerSm
// blocks per multiprocessor (`sms` of them), so the device would be short of work, and the states
// fit in max_state_bytes (and the parts in a grid's y extent). Returns the parts to launch (1:
// unsplit).
constexpr int64_t kSplitBelowBlocksPerSm = 4;
constexpr int64_t kMaxGridY = 65535;
inline int64_t attention_split_parts(int64_t blocks, int64_t sms, int64_t max_parts, int64_t state_bytes,
                                     int64_t max_state_bytes) {
  if (max_parts <= 1 || max_parts > kMaxGridY || sms <= 0 || blocks >= kSplitBelowBlocksPerSm * sms) return 1;
  if (state_bytes > max_state_bytes) return 1;
  return max_parts;
}

}  // namespace shardlm::cuda
