#include "cpu/logit_edits.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace shardlm::cpu {

void edited_row(const float* x, int64_t n, const sampling::TokenEdit* edits, int64_t count, bool allowed_only,
                float repetition, float frequency, float presence, float* out) {
  if (allowed_only) {
    std::fill(out, out + n, -INFINITY);
  } else {
    std::copy(x, x + n, out);
  }
  for (int64_t i = 0; i < count; ++i) {
    const sampling::TokenEdit& e = edits[i];
    if (e.token < 0 || e.token >= n) {
      throw std::out_of_range("logit edits: token " + std::to_string(e.token) + " outside a vocabulary of " +
                              std::to_string(n));
    }
    out[e.token] = sampling::edited_logit(x[e.token], e, allowed_only, repetition, frequency, presence);
  }
}

}  // namespace shardlm::cpu
