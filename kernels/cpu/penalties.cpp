#include "cpu/penalties.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardlm::cpu {

void penalized_row(const float* x, int64_t n, const sampling::SeenToken* seen, int64_t count, float repetition,
                   float frequency, float presence, float* out) {
  std::copy(x, x + n, out);
  for (int64_t i = 0; i < count; ++i) {
    const sampling::SeenToken& s = seen[i];
    if (s.token < 0 || s.token >= n) {
      throw std::out_of_range("penalties: seen token " + std::to_string(s.token) + " outside a vocabulary of " +
                              std::to_string(n));
    }
    out[s.token] = sampling::penalized_logit(x[s.token], repetition, frequency, presence, s.output_count);
  }
}

}  // namespace shardlm::cpu
