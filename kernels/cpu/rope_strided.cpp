#include "cpu/rope_strided.h"

#include <cmath>
#include <vector>

#include "cpu/threads.h"

namespace shardlm::cpu {

void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                  int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                  float attention_factor, float* out) {
  const int64_t half = rot_dim / 2;
#pragma omp parallel num_threads(num_threads()) if (T * n_heads * rot_dim >= kParallelValues)
  {
    std::vector<float> c(half), s(half), tmp(rot_dim);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float p = static_cast<float>(pos[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float a = p * inv_freq[i];
        c[i] = std::cos(a) * attention_factor;
        s[i] = std::sin(a) * attention_factor;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* v = x + t * x_stride + h * head_stride;
        float* o = out + (t * n_heads + h) * rot_dim;
        // Rotate into tmp first: out may be x itself.
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = interleaved ? v[2 * i] : v[i];
          const float x2 = interleaved ? v[2 * i + 1] : v[i + half];
          tmp[i] = x1 * c[i] - x2 * s[i];
          tmp[i + half] = x2 * c[i] + x1 * s[i];
        }
        for (int64_t i = 0; i < rot_dim; ++i) o[i] = tmp[i];
      }
    }
  }
}

}  // namespace shardlm::cpu
