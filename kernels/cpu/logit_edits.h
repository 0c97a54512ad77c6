// vLLM's logit controls and penalties on one row of logits, for the host sampler: the row copied
// (every token barred, for a row that keeps only its allowed tokens) with each listed token's
// logit edited by sampling::edited_logit, the rule the CUDA sampler applies too.
#pragma once

#include <cstdint>

#include "sample_rules.h"

namespace shardlm::cpu {

// out[0, n) = x (or -inf everywhere when allowed_only) with out[t] = edited_logit(x[t], ...) for
// every listed token t (each listed once). Throws std::out_of_range for a token outside [0, n).
void edited_row(const float* x, int64_t n, const sampling::TokenEdit* edits, int64_t count, bool allowed_only,
                float repetition, float frequency, float presence, float* out);

}  // namespace shardlm::cpu
