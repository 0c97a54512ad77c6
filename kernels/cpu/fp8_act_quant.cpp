#include "cpu/fp8_act_quant.h"

#include <algorithm>
#include <cmath>

#include "fp8_bits.h"

namespace shardlm::cpu {

void fp8_act_quant(const float* x, int64_t M, int64_t K, uint8_t* q, float* scales, int64_t scale_ld) {
  const int64_t L = (K + kFp8ActBlock - 1) / kFp8ActBlock;
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    for (int64_t b = 0; b < L; ++b) {
      const int64_t k0 = b * kFp8ActBlock, k1 = std::min(K, k0 + kFp8ActBlock);
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = fp8_bits::nan_skipping_max(amax, std::fabs(row[k]));
      const float s = fp8_bits::act_scale(amax);
      for (int64_t k = k0; k < k1; ++k) q[m * K + k] = fp8_bits::from_f32(row[k] / s);
      scales[b * scale_ld + m] = s;
    }
  }
}

}  // namespace shardlm::cpu
