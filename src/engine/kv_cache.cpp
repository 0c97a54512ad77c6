#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

DType resolve_kv_dtype(const std::string& name, DType checkpoint_dtype) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::F8_E4M3;
  SHARDLM_CHECK(name == "auto", "--kv-dtype must be auto, fp32, bf16 or fp8, not '" << name << "'");
  return checkpoint_dtype == DType::BF16 ? DType::BF16 : DType::F32;
}

const char* kv_dtype_name(DType dtype) {
  if (dtype == DType::BF16) return "bf16";
  return dtype == DType::F8_E4M3 ? "fp8" : "fp32";
}

KvCache::KvCache(ComputeBackend& backend, const KvCacheShape& shape, int64_t budget_bytes, int64_t max_blocks)
    : backend_(backend), shape_(shape) {
  SHARDLM_CHECK(shape.dtype == DType::F32 || shape.dtype == DType::BF16 || shape.dtype == DType::F8_E4M3,
                "a KV cache of " << dtype_name(shape.dtype) << ": F32, BF16 and F8_E4M3 are kept");
  const int64_t per_block = shape.bytes_per_block();
  const int64_t fit = budget_bytes / per_block;
  SHARDLM_CHECK(fit >= 1, "KV cache budget of " << budget_bytes << " bytes holds no block of " << per_block
                                                 << " bytes (" << shape.block_size
                                                 << " tokens); raise --kv-cache-gb");
  num_blocks_ = static_cast<int32_t>(std::min<int64_t>({fit, max_blocks, INT32_MAX}));
  const size_t slots = static_cast<size_t>(num_blocks_) * shape.block_size, elem = dtype_size(shape.dtype);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    k_.push_back(backend.alloc(slots * shape.k_width * elem));
    v_.push_back(shape.v_width > 0 ? backend.alloc(slots * shape.v_width * elem) : nullptr);
  }
}

KvCache::~KvCache() {
  for (void* p : k_) backend_.free(p);
  for (void* p : v_) {
    if (p) backend_.free(p);
  }
}

}  // namespace shardlm
