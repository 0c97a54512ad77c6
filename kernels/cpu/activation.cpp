#include "cpu/activation.h"

#include <cmath>

#include "cpu/threads.h"

namespace shardlm::cpu {

// silu(g) = g / (1 + exp(-g)); elementwise, so any split over threads gives the same bits.
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n >= 262144)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace shardlm::cpu
