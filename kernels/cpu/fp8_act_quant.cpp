#include "cpu/fp8_act_quant.h"

#include <algorithm>

#include "cpu/fp8_narrow.h"

namespace shardlm::cpu {

void fp8_act_quant(const float* x, int64_t M, int64_t K, uint8_t* q, float* scales, int64_t scale_ld) {
  const int64_t L = (K + kFp8ActBlock - 1) / kFp8ActBlock;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < L; ++b) {
      const int64_t k0 = b * kFp8ActBlock, n = std::min(K - k0, kFp8ActBlock);
      scales[b * scale_ld + m] = detail::quantise_group_e4m3(x + m * K + k0, n, q + m * K + k0);
    }
  }
}

}  // namespace shardlm::cpu
