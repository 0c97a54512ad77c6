// Each head gathers its input slice into a packed [T, K] block, runs the ordinary matmul kernel on
// its own weight and scatters its [T, N] result. Heads run in parallel (each matmul then
// single-threaded inside the parallel region) or in turn (each matmul threaded by itself); the
// arithmetic of every element is the same either way.
#include "cpu/head_matmul.h"

#include <cstring>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/threads.h"

namespace shardlm::cpu {
namespace {

template <typename WT>
void mm(const float* x, int64_t M, int64_t K, const WT* w, int64_t N, float* y) {
  if constexpr (sizeof(WT) == 4)
    matmul_f32w(x, M, K, w, N, nullptr, y);
  else
    matmul_bf16w(x, M, K, w, N, nullptr, y);
}

template <typename WT>
void one_head(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K,
              const WT* w, int64_t N, float* y, int64_t h, std::vector<float>& xb, std::vector<float>& yb) {
  xb.resize(static_cast<size_t>(T * K));
  yb.resize(static_cast<size_t>(T * N));
  for (int64_t t = 0; t < T; ++t) std::memcpy(xb.data() + t * K, x + t * x_stride + h * head_stride, K * sizeof(float));
  mm(xb.data(), T, K, w + h * N * K, N, yb.data());
  for (int64_t t = 0; t < T; ++t) std::memcpy(y + (t * n_heads + h) * N, yb.data() + t * N, N * sizeof(float));
}

template <typename WT>
void head_matmul(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, int64_t K,
                 const WT* w, int64_t N, float* y) {
  if (T <= 0 || n_heads <= 0 || N <= 0) return;
  const double work = static_cast<double>(T) * n_heads * N * K;
  // Heads in parallel when they can fill the threads or each head's product is too small to split;
  // otherwise heads one after another, each matmul split over the threads by its own rule.
  const bool by_head = n_heads > 1 && work >= 64.0 * 1024 && (n_heads >= num_threads() || T <= 8);
  if (!by_head) {
    std::vector<float> xb, yb;
    for (int64_t h = 0; h < n_heads; ++h) one_head(x, T, n_heads, x_stride, head_stride, K, w, N, y, h, xb, yb);
    return;
  }
#pragma omp parallel num_threads(num_threads())
  {
    std::vector<float> xb, yb;
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < n_heads; ++h) one_head(x, T, n_heads, x_stride, head_stride, K, w, N, y, h, xb, yb);
  }
}

}  // namespace

void head_matmul_f32w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                      int64_t K, const float* w, int64_t N, float* y) {
  head_matmul<float>(x, T, n_heads, x_stride, head_stride, K, w, N, y);
}

void head_matmul_bf16w(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                       int64_t K, const uint16_t* w, int64_t N, float* y) {
  head_matmul<uint16_t>(x, T, n_heads, x_stride, head_stride, K, w, N, y);
}

}  // namespace shardlm::cpu
