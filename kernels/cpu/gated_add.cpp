#include "cpu/gated_add.h"

#include <cmath>

namespace shardlm::cpu {

void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) {
  for (int64_t t = 0; t < T; ++t) {
    const float g = gate_logits ? 1.0f / (1.0f + std::exp(-gate_logits[t])) : 1.0f;
    float* o = out + t * H;
    const float* v = y + t * H;
    for (int64_t j = 0; j < H; ++j) o[j] += g * v[j];
  }
}

}  // namespace shardlm::cpu
