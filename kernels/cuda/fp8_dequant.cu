#include "cuda/fp8_dequant.h"

#include <cstdint>

#include "bf16_bits.h"
#include "fp8_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 256;

__device__ inline float decode_e4m3(uint32_t v) { return fp8_bits::to_f32(static_cast<uint8_t>(v)); }

// The product as x86 SSE computes it, NaN bits included: a NaN operand propagates quieted (the
// first one when both are), an invalid operation (0 * inf) gives the negative default NaN. The
// device would return its canonical NaN instead, and the bf16 bits would differ.
__device__ inline float mul_like_x86(float a, float b) {
  if (isnan(a)) return __uint_as_float(__float_as_uint(a) | 0x00400000u);
  if (isnan(b)) return __uint_as_float(__float_as_uint(b) | 0x00400000u);
  const float p = a * b;
  return isnan(p) ? __uint_as_float(0xffc00000u) : p;
}

__global__ void fp8_dequant_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scale_inv,
                                   int64_t scale_cols, int64_t rows, int64_t cols, int64_t row_off, int64_t col_off,
                                   int64_t block_rows, int64_t block_cols, uint16_t* __restrict__ out) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    const float s = scale_inv[((r + row_off) / block_rows) * scale_cols + (c + col_off) / block_cols];
    out[i] = bf16_bits::from_f32(mul_like_x86(decode_e4m3(w[i]), s));
  }
}

}  // namespace

void launch_fp8_dequant(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, int64_t block_rows,
                        int64_t block_cols, uint16_t* out_bf16, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || block_rows <= 0 || block_cols <= 0) return;
  const int64_t n = rows * cols;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 * 64 ? blocks : 65535 * 64);
  fp8_dequant_kernel<<<grid, kThreads, 0, stream>>>(w, scale_inv, (cols + block_cols - 1) / block_cols, rows, cols, 0,
                                                    0, block_rows, block_cols, out_bf16);
}

void launch_fp8_dequant_slice(const uint8_t* w, const float* scale_inv, int64_t scale_cols, int64_t rows, int64_t cols,
                              int64_t row0, int64_t col0, int64_t block_rows, int64_t block_cols, uint16_t* out_bf16,
                              cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || block_rows <= 0 || block_cols <= 0) return;
  const int64_t n = rows * cols;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 * 64 ? blocks : 65535 * 64);
  fp8_dequant_kernel<<<grid, kThreads, 0, stream>>>(w, scale_inv, scale_cols, rows, cols, row0 % block_rows,
                                                    col0 % block_cols, block_rows, block_cols, out_bf16);
}

}  // namespace shardlm::cuda
