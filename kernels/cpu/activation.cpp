#include "cpu/activation.h"

#include <cmath>

#include "cpu/threads.h"

namespace shardlm::cpu {

namespace {

// silu(g) = g / (1 + exp(-g)), times up; both forms compute each element here.
inline float silu_times(float g, float up) { return g / (1.0f + std::exp(-g)) * up; }

}  // namespace

// Elementwise, so any split over threads gives the same bits.
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = silu_times(gate[i], up[i]);
}

void silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, float* out) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (rows * width >= 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + 2 * r * width;
    for (int64_t c = 0; c < width; ++c) out[r * width + c] = silu_times(g[c], g[width + c]);
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n >= 262144)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace shardlm::cpu
