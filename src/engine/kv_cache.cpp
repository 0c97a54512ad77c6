#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

KvCache::KvCache(ComputeBackend& backend, const KvCacheShape& shape, int64_t budget_bytes, int64_t max_blocks)
    : backend_(backend), shape_(shape) {
  const int64_t per_block = shape.bytes_per_block();
  const int64_t fit = budget_bytes / per_block;
  SHARDLM_CHECK(fit >= 1, "KV cache budget of " << budget_bytes << " bytes holds no block of " << per_block
                                                 << " bytes (" << shape.block_size
                                                 << " tokens); raise --kv-cache-gb");
  num_blocks_ = static_cast<int32_t>(std::min<int64_t>({fit, max_blocks, INT32_MAX}));
  const size_t slots = static_cast<size_t>(num_blocks_) * shape.block_size;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    k_.push_back(static_cast<float*>(backend.alloc(slots * shape.k_width * 4)));
    v_.push_back(shape.v_width > 0 ? static_cast<float*>(backend.alloc(slots * shape.v_width * 4)) : nullptr);
  }
}

KvCache::~KvCache() {
  for (float* p : k_) backend_.free(p);
  for (float* p : v_) {
    if (p) backend_.free(p);
  }
}

}  // namespace shardlm
