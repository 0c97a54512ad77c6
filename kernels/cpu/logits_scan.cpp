#include "cpu/logits_scan.h"

#include <cmath>

#include "cpu/vec16.h"
#include "cpu/vector_exp.h"

namespace shardlm::cpu {

using detail::load16;
using detail::select16;
using detail::v16f;
using detail::v16i;

int64_t argmax_logit(const float* x, int64_t n, float* row_max) {
  // Per lane the maximum and the first index holding it (a strict > keeps the first), then the
  // lowest index among the lanes holding the row's maximum: one read of the row.
  float tail[16];
  const int64_t full = detail::pad_tail16(x, n, tail);
  v16f m = v16f{} - INFINITY;
  v16i at = v16i{} - 1, idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int64_t j = 0; j <= full; j += 16, idx += 16) {
    const v16f v = load16(j < full ? x + j : tail);
    const v16i more = v > m;
    m = select16(more, v, m);
    at = (idx & more) | (at & ~more);
  }
  float mx = -INFINITY;
  int64_t best = -1;
  for (int l = 0; l < 16; ++l) {
    if (at[l] < 0) continue;  // this lane saw only NaN or padding
    if (m[l] > mx || (m[l] == mx && at[l] < best)) mx = m[l], best = at[l];
  }
  if (row_max) *row_max = mx;
  return best < 0 ? 0 : best;
}

namespace {

// x[i] - mx - log(sum_j exp(x[j] - mx)); `tail` holds the row's last n % 16 logits padded with -inf.
float log_softmax_with(const float* x, int64_t n, int64_t i, float mx, const float* tail) {
  typedef double v8d __attribute__((vector_size(64)));
  const v16f vmx = v16f{} + mx;
  v8d lo{}, hi{};
  auto add = [&](v16f e) {
    lo += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7), v8d);
    hi += __builtin_convertvector(__builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15), v8d);
  };
  const int64_t full = n / 16 * 16;
  for (int64_t j = 0; j < full; j += 16) add(detail::exp16(load16(x + j) - vmx));
  add(detail::exp16(load16(tail) - vmx));  // padding lanes add exp(-inf) = 0
  double sum = 0;
  for (int l = 0; l < 8; ++l) sum += lo[l] + hi[l];
  return static_cast<float>(static_cast<double>(x[i]) - mx - std::log(sum));
}

}  // namespace

float log_softmax_at(const float* x, int64_t n, int64_t i) {
  float tail[16];
  const float mx = detail::max16(x, n, tail);
  return log_softmax_with(x, n, i, mx, tail);
}

float log_softmax_at(const float* x, int64_t n, int64_t i, float row_max) {
  float tail[16];
  detail::pad_tail16(x, n, tail);
  return log_softmax_with(x, n, i, row_max, tail);
}

}  // namespace shardlm::cpu
