#include "cpu/abs_max.h"

#include <cmath>

namespace shardlm::cpu {

void abs_max(const float* x, int64_t n, float* acc) {
  float m = *acc;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  *acc = m;
}

}  // namespace shardlm::cpu
