#include "engine/block_allocator.h"

#include "core/error.h"

namespace shardlm {

BlockAllocator::BlockAllocator(int32_t num_blocks) : num_blocks_(num_blocks) {
  SHARDLM_CHECK(num_blocks > 0, "KV cache has no blocks");
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

bool BlockAllocator::allocate(int32_t n, std::vector<int32_t>* table) {
  if (n <= 0) return true;
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    table->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::release(std::vector<int32_t>* table) {
  for (auto it = table->rbegin(); it != table->rend(); ++it) free_.push_back(*it);
  table->clear();
}

}  // namespace shardlm
