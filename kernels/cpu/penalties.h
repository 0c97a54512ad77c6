// vLLM's repetition, frequency and presence penalties on one row of logits, for the host sampler:
// the row copied with each seen token's logit penalized (sampling::penalized_logit, the rule the
// CUDA sampler applies too).
#pragma once

#include <cstdint>

#include "sample_rules.h"

namespace shardlm::cpu {

// out[0, n) = x with out[t] = penalized_logit(x[t], ...) for every seen token t (each listed once:
// the list is of distinct tokens). Throws std::out_of_range for a token outside [0, n).
void penalized_row(const float* x, int64_t n, const sampling::SeenToken* seen, int64_t count, float repetition,
                   float frequency, float presence, float* out);

}  // namespace shardlm::cpu
