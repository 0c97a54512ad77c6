// The largest magnitude of a buffer, folded into a running maximum: *acc = max(*acc, max_i |x[i]|).
// KV cache calibration (--kv-calibrate-out) measures each layer's keys and values with it; NaNs are
// skipped (fmax), so one bad token cannot make a scale NaN.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

void abs_max(const float* x, int64_t n, float* acc);

}  // namespace shardlm::cpu
