#include "cuda/embedding.h"

#include "cuda/launch_util.cuh"

namespace shardlm::cuda {
namespace {

__device__ inline float widen(float v) { return v; }
__device__ inline float widen(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

template <typename WT>
__global__ void embedding_kernel(const int32_t* ids, int64_t T, const WT* table, int64_t dim, float* out) {
  const int64_t n = T * dim;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    const int64_t t = i / dim, c = i % dim;
    const int32_t id = ids[t];
    out[i] = id < 0 ? 0.0f : widen(table[static_cast<int64_t>(id) * dim + c]);
  }
}

template <typename WT>
void launch(const int32_t* ids, int64_t T, const WT* table, int64_t dim, float* out, cudaStream_t stream) {
  const int64_t n = T * dim;
  if (n <= 0) return;
  embedding_kernel<WT><<<detail::elementwise_blocks(n), detail::kElementwiseThreads, 0, stream>>>(ids, T, table,
                                                                                                  dim, out);
}

}  // namespace

void embedding_f32(const int32_t* ids, int64_t T, const float* table, int64_t dim, float* out, cudaStream_t stream) {
  launch(ids, T, table, dim, out, stream);
}

void embedding_bf16(const int32_t* ids, int64_t T, const uint16_t* table, int64_t dim, float* out,
                    cudaStream_t stream) {
  launch(ids, T, table, dim, out, stream);
}

}  // namespace shardlm::cuda
