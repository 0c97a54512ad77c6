// Paged KV cache storage: per layer, a K side of num_blocks x block_size x k_width and a V side of
// num_blocks x block_size x v_width values (fp32, bf16 or fp8 e4m3) in backend memory, sized from a
// byte budget (the order inside a block is the backend's: ComputeBackend::kv_write). GQA keeps
// n_kv_heads x head_dim on each side; MLA keeps its latent + rope key on the K side and no V side.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compute/backend.h"

namespace shardlm {

struct KvCacheShape {
  int64_t num_layers = 0;
  int64_t k_width = 0;  // values per token per layer, K side
  int64_t v_width = 0;  // ... V side (0: none)
  int64_t block_size = 16;
  DType dtype = DType::F32;  // F32, BF16 or F8_E4M3

  int64_t bytes_per_block() const {
    return num_layers * block_size * (k_width + v_width) * static_cast<int64_t>(dtype_size(dtype));
  }
  int64_t bytes_per_token() const { return bytes_per_block() / block_size; }
};

// The cache dtype --kv-dtype names: "fp32", "bf16", "fp8" (or "fp8_e4m3", as vLLM spells it:
// e4m3fn codes with a per-layer scale, kernels/kv_cache_format.h), or "auto": bf16 for a
// checkpoint whose torch_dtype is bfloat16 (the dtype vLLM and transformers cache such a model
// in), fp32 otherwise. fp8 is never automatic: it changes the results. Throws on any other name.
DType resolve_kv_dtype(const std::string& name, DType checkpoint_dtype);
// "fp32", "bf16" or "fp8".
const char* kv_dtype_name(DType dtype);

class KvCache {
 public:
  // Allocates floor(budget_bytes / bytes_per_block) blocks, capped at max_blocks.
  KvCache(ComputeBackend& backend, const KvCacheShape& shape, int64_t budget_bytes, int64_t max_blocks);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheShape& shape() const { return shape_; }
  int32_t num_blocks() const { return num_blocks_; }
  // Layer `layer`'s two sides (v null when v_width is 0).
  KvCacheRef layer(int64_t layer) const { return {k_[layer], v_[layer], shape_.dtype}; }

 private:
  ComputeBackend& backend_;
  KvCacheShape shape_;
  int32_t num_blocks_ = 0;
  std::vector<void*> k_, v_;
};

}  // namespace shardlm
