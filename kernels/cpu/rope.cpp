#include "cpu/rope.h"

#include <cmath>
#include <vector>

#include "cpu/threads.h"

namespace shardlm::cpu {

// Angle = float(pos) * inv_freq[i] in fp32 (as Hugging Face computes freqs), then cosf / sinf.
// out[i] = x1*cos - x2*sin; out[i+half] = x2*cos + x1*sin (q*cos + rotate_half(q)*sin).
void rope_rotate_half(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                      const float* inv_freq) {
  const int64_t half = head_dim / 2;
#pragma omp parallel num_threads(num_threads()) if (T * n_heads * head_dim >= kParallelValues)
  {
    std::vector<float> c(half), s(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float p = static_cast<float>(pos[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float a = p * inv_freq[i];
        c[i] = std::cos(a);
        s[i] = std::sin(a);
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c[i] - x2 * s[i];
          v[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
    }
  }
}

}  // namespace shardlm::cpu
