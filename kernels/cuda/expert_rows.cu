#include "cuda/expert_rows.h"

#include <cstdint>

#include "bf16_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kRowThreads = 256;

// One block per output row (grid-stride over rows), the block's threads over its H columns.
__global__ void gather_rows_kernel(const float* __restrict__ src, int64_t H, const int32_t* __restrict__ rows,
                                   int64_t n, float* __restrict__ dst, uint16_t* __restrict__ twin) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t row = rows[i];
    if (row == kKeepRow) continue;
    float* d = dst + i * H;
    const float* s = src + static_cast<int64_t>(row < 0 ? 0 : row) * H;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      const float v = row < 0 ? 0.0f : s[c];
      d[c] = v;
      if (twin) twin[i * H + c] = bf16_bits::from_f32(v);
    }
  }
}

// One block per token (grid-stride over tokens); each thread sums its columns over the token's
// range in index order. __fmul_rn / __fadd_rn keep the product and the sum separately rounded
// whatever the compiler's contraction setting (the CPU reference does not fuse them). Y: float
// rows, or bf16 ones widened exactly.
template <typename Y>
__global__ void combine_rows_kernel(const Y* __restrict__ y, int64_t H, const int32_t* __restrict__ token_start,
                                    const int32_t* __restrict__ rows, const float* __restrict__ weights, int64_t T,
                                    float* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t begin = token_start[t], end = token_start[t + 1];
    float* o = out + t * H;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      float acc = 0.0f;
      for (int32_t i = begin; i < end; ++i)
        acc = __fadd_rn(acc, __fmul_rn(weights[i], bf16_bits::widen(y[static_cast<int64_t>(rows[i]) * H + c])));
      o[c] = acc;
    }
  }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16); }

}  // namespace

void launch_gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, float* dst, uint16_t* twin,
                        cudaStream_t stream) {
  if (H <= 0 || n <= 0) return;
  gather_rows_kernel<<<grid_for(n), kRowThreads, 0, stream>>>(src, H, rows, n, dst, twin);
}

void launch_combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                         const float* weights, int64_t T, float* out, cudaStream_t stream) {
  if (H <= 0 || T <= 0) return;
  combine_rows_kernel<float><<<grid_for(T), kRowThreads, 0, stream>>>(y, H, token_start, rows, weights, T, out);
}

void launch_combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                              const float* weights, int64_t T, float* out, cudaStream_t stream) {
  if (H <= 0 || T <= 0) return;
  combine_rows_kernel<uint16_t><<<grid_for(T), kRowThreads, 0, stream>>>(y, H, token_start, rows, weights, T, out);
}

}  // namespace shardlm::cuda
