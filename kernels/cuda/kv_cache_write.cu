#include "cuda/kv_cache_write.h"

#include "cuda/attention_util.cuh"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

__global__ void kv_cache_write_kernel(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t row,
                                      void* k_cache, void* v_cache, bool bf16) {
  const int64_t n = T * row;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const int64_t t = i / row, c = i % row;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    detail::cache_store(k_cache, slot * row + c, k[i], bf16);
    detail::cache_store(v_cache, slot * row + c, v[i], bf16);
  }
}

}  // namespace

void kv_cache_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                    int64_t head_dim, void* k_cache, void* v_cache, bool bf16_cache, cudaStream_t stream) {
  const int64_t row = n_kv_heads * head_dim;
  if (T <= 0 || row <= 0) return;
  kv_cache_write_kernel<<<detail::elementwise_blocks(T * row), detail::kElementwiseThreads, 0, stream>>>(
      k, v, T, slots, row, k_cache, v_cache, bf16_cache);
}

}  // namespace shardlm::cuda
