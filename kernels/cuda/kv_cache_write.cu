#include "cuda/kv_cache_write.h"

#include "cuda/attention_util.cuh"
#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

__global__ void kv_cache_write_kernel(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t row,
                                      void* k_cache, void* v_cache, KvFormat fmt) {
  const int64_t n = T * row;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const int64_t t = i / row, c = i % row;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    kv_store(k_cache, slot * row + c, k[i], fmt.elem, fmt.k_scale);
    kv_store(v_cache, slot * row + c, v[i], fmt.elem, fmt.v_scale);
  }
}

}  // namespace

void kv_cache_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                    int64_t head_dim, void* k_cache, void* v_cache, KvFormat cache_fmt, cudaStream_t stream) {
  const int64_t row = n_kv_heads * head_dim;
  if (T <= 0 || row <= 0) return;
  kv_cache_write_kernel<<<detail::elementwise_blocks(T * row), detail::kElementwiseThreads, 0, stream>>>(
      k, v, T, slots, row, k_cache, v_cache, cache_fmt);
}

}  // namespace shardlm::cuda
