#include "cpu/rmsnorm.h"

#include <cmath>

#include "cpu/reduce_util.h"
#include "cpu/threads.h"

namespace shardlm::cpu {
namespace {

// out = x * (1 / sqrt(mean(x^2) + eps)) * w, in the order Hugging Face's LlamaRMSNorm applies it:
// w * (x * rsqrt(var + eps)).
inline void norm_row(const float* x, const float* w, int64_t dim, float eps, float* out) {
  const float var = detail::sumsq16(x, dim) / static_cast<float>(dim);
  const float r = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < dim; ++i) out[i] = w[i] * (x[i] * r);
}

}  // namespace

void rmsnorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (rows * dim >= kParallelValues)
  for (int64_t r = 0; r < rows; ++r) norm_row(x + r * dim, w, dim, eps, out + r * dim);
}

void add_rmsnorm(float* residual, const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                 float* out) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (rows * dim >= kParallelValues)
  for (int64_t r = 0; r < rows; ++r) {
    float* res = residual + r * dim;
    const float* xr = x + r * dim;
    for (int64_t i = 0; i < dim; ++i) res[i] += xr[i];
    norm_row(res, w, dim, eps, out + r * dim);
  }
}

}  // namespace shardlm::cpu
