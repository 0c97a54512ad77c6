// Classic shared-memory tiling: a thread block computes a kTile x kTile tile (tokens x outputs) of
// one head, staging kTile-wide K slices of x and of the head's weight in shared memory (the weight
// widened to fp32 on load, which is exact). Thread (tx, ty) owns output column tx of rows
// ty, ty + kRowsStep, ...; it accumulates with fmaf, as the CPU matmul does, in increasing k.
#include "cuda/head_matmul.h"

#include "bf16_bits.h"

namespace shardlm::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kRowsStep = 8;  // blockDim = (kTile, kRowsStep)
constexpr int kRowsPerThread = kTile / kRowsStep;
constexpr int kThreads = kTile * kRowsStep;

__device__ inline float widen(float v) { return v; }
__device__ inline float widen(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

template <typename WT>
__global__ void __launch_bounds__(kThreads)
    head_matmul_kernel(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K,
                       const WT* w, int64_t N, float* y, uint16_t* twin) {
  __shared__ float xs[kTile][kTile + 1];  // [token][k]; +1 keeps column reads free of bank conflicts
  __shared__ float ws[kTile][kTile + 1];  // [output][k]
  const int64_t h = blockIdx.z;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * kTile + tx;
  const WT* wh = w + h * N * K;

  float acc[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) acc[r] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    // Each thread loads kTile*kTile/kThreads elements of each tile; consecutive threads take
    // consecutive k, so the global reads are coalesced along a row.
    for (int i = tid; i < kTile * kTile; i += kThreads) {
      const int r = i / kTile, c = i % kTile;
      const int64_t k = k0 + c;
      const int64_t t = t0 + r, n = n0 + r;
      xs[r][c] = (t < T && k < K) ? x[t * x_stride + h * head_stride + k] : 0.0f;
      ws[r][c] = (n < N && k < K) ? widen(wh[n * K + k]) : 0.0f;
    }
    __syncthreads();
    // Zero padding past K would be exact (fma(0, 0, a) == a) but is skipped anyway, so the
    // per-element operation sequence is exactly k = 0 .. K-1.
    const int kc = static_cast<int>(K - k0 < kTile ? K - k0 : kTile);
    for (int c = 0; c < kc; ++c) {
      const float wv = ws[tx][c];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) acc[r] = fmaf(xs[ty + r * kRowsStep][c], wv, acc[r]);
    }
    __syncthreads();  // the tiles are reloaded by the next K slice
  }

  const int64_t n = n0 + tx;
  if (n >= N) return;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int64_t t = t0 + ty + r * kRowsStep;
    if (t >= T) continue;
    const int64_t i = (t * n_heads + h) * N + n;
    y[i] = acc[r];
    if (twin) twin[i] = bf16_bits::from_f32(acc[r]);
  }
}

template <typename WT>
void launch(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K, const WT* w,
            int64_t N, float* y, uint16_t* twin, cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || N <= 0) return;
  // K == 0 still launches: the outputs are then zeros, as the CPU gives.
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile), static_cast<unsigned>((T + kTile - 1) / kTile),
                  static_cast<unsigned>(n_heads));
  head_matmul_kernel<WT>
      <<<grid, dim3(kTile, kRowsStep), 0, stream>>>(x, T, n_heads, x_stride, head_stride, K, w, N, y, twin);
}

}  // namespace

void head_matmul_f32w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K,
                      const float* w, int64_t N, float* y, uint16_t* twin, cudaStream_t stream) {
  launch(x, T, n_heads, x_stride, head_stride, K, w, N, y, twin, stream);
}

void head_matmul_bf16w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K,
                       const uint16_t* w, int64_t N, float* y, uint16_t* twin, cudaStream_t stream) {
  launch(x, T, n_heads, x_stride, head_stride, K, w, N, y, twin, stream);
}

}  // namespace shardlm::cuda
