// The sampler's candidate order: token ids by logit, descending, ties by ascending id (a total
// order, so a sampled pick is deterministic). A stable radix sort on order-preserving integer keys
// gives exactly the order of a comparison sort on (logit desc, id asc) in O(vocab) instead of
// O(vocab log vocab) indirect comparisons; -0.0 and +0.0 compare equal, as in the comparison.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

class LogitOrder {
 public:
  // order receives all n ids 0..n-1 in that order. Buffers are reused across calls.
  void sort(const float* logits, int64_t n, std::vector<int32_t>* order);

 private:
  std::vector<uint64_t> items_, items_tmp_;  // key << 32 | id
};

// Ascending in this key is descending in x (x a non-NaN float; -0.0 maps like +0.0).
uint32_t descending_key(float x);

}  // namespace shardlm
