// The sampler's candidate order: token ids by logit, descending, ties by ascending id (a total
// order, so a sampled pick is deterministic; sampling::candidate_key). A stable radix sort on the
// keys gives exactly the order of a comparison sort on (logit desc, id asc) in O(n) instead of
// O(n log n) comparisons; -0.0 and +0.0 compare equal, NaN as -inf. The host sampler sorts one
// band of candidates at a time with it (engine/candidate_bands.h).
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

class LogitOrder {
 public:
  // Sorts candidate keys (sampling::candidate_key) into the order. The items must come in
  // ascending id order, as a scan of the row gathers them: the radix passes are stable.
  void sort_keys(std::vector<uint64_t>* items);

 private:
  std::vector<uint64_t> items_tmp_;  // reused across calls
};

}  // namespace shardlm
