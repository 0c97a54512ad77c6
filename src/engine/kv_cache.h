// Paged KV cache storage: per layer, K and V of [num_blocks, block_size, n_kv_heads, head_dim]
// fp32 in backend memory, sized from a byte budget.
#pragma once

#include <cstdint>
#include <vector>

#include "compute/backend.h"

namespace shardlm {

struct KvCacheShape {
  int64_t num_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;

  int64_t bytes_per_block() const { return 2 * num_layers * block_size * n_kv_heads * head_dim * 4; }
  int64_t bytes_per_token() const { return bytes_per_block() / block_size; }
};

class KvCache {
 public:
  // Allocates floor(budget_bytes / bytes_per_block) blocks, capped at max_blocks.
  KvCache(ComputeBackend& backend, const KvCacheShape& shape, int64_t budget_bytes, int64_t max_blocks);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheShape& shape() const { return shape_; }
  int32_t num_blocks() const { return num_blocks_; }
  float* k(int64_t layer) { return k_[layer]; }
  float* v(int64_t layer) { return v_[layer]; }

 private:
  ComputeBackend& backend_;
  KvCacheShape shape_;
  int32_t num_blocks_ = 0;
  std::vector<float*> k_, v_;
};

}  // namespace shardlm
