#include "cpu/expert_rows.h"

#include <algorithm>
#include <cstring>

#include "bf16_bits.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

void gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, float* dst) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n * H >= kParallelValues)
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] == kKeepRow) continue;
    if (rows[i] < 0) {
      std::fill(dst + i * H, dst + (i + 1) * H, 0.0f);
    } else {
      std::memcpy(dst + i * H, src + static_cast<int64_t>(rows[i]) * H, static_cast<size_t>(H) * sizeof(float));
    }
  }
}

namespace {

template <typename Y>
void combine(const Y* y, int64_t H, const int32_t* token_start, const int32_t* rows, const float* weights, int64_t T,
             float* out) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (T * H >= kParallelValues)
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * H;
    std::fill(o, o + H, 0.0f);
    for (int32_t i = token_start[t]; i < token_start[t + 1]; ++i) {
      const float w = weights[i];
      const Y* r = y + static_cast<int64_t>(rows[i]) * H;
      for (int64_t c = 0; c < H; ++c) o[c] += w * bf16_bits::widen(r[c]);
    }
  }
}

}  // namespace

void combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows, const float* weights,
                  int64_t T, float* out) {
  combine(y, H, token_start, rows, weights, T, out);
}

void combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                       const float* weights, int64_t T, float* out) {
  combine(y, H, token_start, rows, weights, T, out);
}

}  // namespace shardlm::cpu
