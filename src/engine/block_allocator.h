// Fixed-size KV block bookkeeping: which physical blocks are free.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_blocks_ - num_free(); }
  // Appends n blocks to `table`; returns false (taking nothing) when fewer than n are free.
  bool allocate(int32_t n, std::vector<int32_t>* table);
  void release(std::vector<int32_t>* table);

 private:
  int32_t num_blocks_;
  std::vector<int32_t> free_;  // a stack: recently freed blocks are reused first (warm in cache)
};

}  // namespace shardlm
