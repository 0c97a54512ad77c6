#include "cpu/expert_permute.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "bf16_bits.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

void expert_permute(const int32_t* topk_ids, int64_t T, int64_t k, int32_t e0, int64_t E, const int32_t* pos,
                    int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts) {
  const int64_t P = T * k;
  // The pair's local expert, or -1 (not local, or a padding row's).
  auto local_of = [&](int64_t i) -> int64_t {
    if (pos && pos[i / k] < 0) return -1;
    const int64_t e = static_cast<int64_t>(topk_ids[i]) - e0;
    return e >= 0 && e < E ? e : -1;
  };
  std::fill(offsets, offsets + E + 1, 0);
  for (int64_t i = 0; i < P; ++i) {
    const int64_t e = local_of(i);
    if (e >= 0) ++offsets[e + 1];
  }
  if (counts)
    for (int64_t e = 0; e < E; ++e) counts[e] += offsets[e + 1];
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> next(offsets, offsets + E);
  for (int64_t i = 0; i < P; ++i) {
    const int64_t e = local_of(i);
    if (e >= 0) {
      const int32_t r = next[e]++;
      slot_row[i] = r;
      row_pair[r] = static_cast<int32_t>(i);
    } else {
      slot_row[i] = -1;
    }
  }
}

void expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* num_rows,
                   int64_t max_rows, float* xp) {
  const int64_t rows = std::min<int64_t>(*num_rows, max_rows);
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (rows * H >= kParallelValues)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(xp + r * H, x + (row_pair[r] / k) * H, static_cast<size_t>(H) * sizeof(float));
}

namespace {

template <typename Y>
void combine(const Y* yp, int64_t H, const int32_t* topk_ids, const float* topk_w, const int32_t* slot_row, int64_t T,
             int64_t k, float* out) {
#pragma omp parallel num_threads(num_threads()) if (T * H >= kParallelValues)
  {
    std::vector<int64_t> order(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* ids = topk_ids + t * k;
      const int32_t* rows = slot_row + t * k;
      int64_t n = 0;
      for (int64_t j = 0; j < k; ++j)
        if (rows[j] >= 0) order[n++] = j;
      std::sort(order.begin(), order.begin() + n,
                [&](int64_t a, int64_t b) { return ids[a] < ids[b] || (ids[a] == ids[b] && a < b); });
      float* o = out + t * H;
      std::fill(o, o + H, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float w = topk_w[t * k + order[i]];
        const Y* y = yp + static_cast<int64_t>(rows[order[i]]) * H;
        for (int64_t c = 0; c < H; ++c) o[c] += w * bf16_bits::widen(y[c]);
      }
    }
  }
}

}  // namespace

void expert_combine(const float* yp, int64_t H, const int32_t* topk_ids, const float* topk_w, const int32_t* slot_row,
                    int64_t T, int64_t k, float* out) {
  combine(yp, H, topk_ids, topk_w, slot_row, T, k, out);
}

void expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* topk_ids, const float* topk_w,
                         const int32_t* slot_row, int64_t T, int64_t k, float* out) {
  combine(yp, H, topk_ids, topk_w, slot_row, T, k, out);
}

}  // namespace shardlm::cpu
