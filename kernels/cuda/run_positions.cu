#include "cuda/run_positions.h"

namespace shardlm::cuda {
namespace {

__global__ void single_token_positions_kernel(const int32_t* pos, const int32_t* table_start, int64_t T, int32_t* out) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[t] = in_run(table_start, T, t) ? -1 : pos[t];
}

}  // namespace

void launch_single_token_positions(const int32_t* pos, const int32_t* table_start, int64_t T, int32_t* out,
                                   cudaStream_t stream) {
  if (T <= 0) return;
  const int threads = 256;
  const int64_t blocks = (T + threads - 1) / threads;
  single_token_positions_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(
      pos, table_start, T, out);
}

}  // namespace shardlm::cuda
