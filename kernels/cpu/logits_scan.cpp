#include "cpu/logits_scan.h"

#include <cmath>
#include <cstring>

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

double temperature_probs(const float* x, const int32_t* order, int64_t n, double top, double inv_t, float* probs) {
  using detail::v8d;
  typedef float v8f __attribute__((vector_size(32)));
  const v8d vtop = v8d{} + top, vinv = v8d{} + inv_t;
  auto probs8 = [&](const float* in) {
    v8f a;
    std::memcpy(&a, in, sizeof a);
    return __builtin_convertvector(detail::exp8d((__builtin_convertvector(a, v8d) - vtop) * vinv), v8f);
  };
  // Two groups of 8 per round: independent exponentials for the core to overlap. Plain float
  // arrays and whole-vector copies only (no arrays of vectors), so nothing needs more than the
  // stack's usual alignment.
  v8d sum0{}, sum1{};
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t m = n - j < 16 ? n - j : 16;
    float in[16] = {}, out[16];
    for (int64_t l = 0; l < m; ++l) in[l] = x[order[j + l]];
    const v8f f0 = probs8(in), f1 = probs8(in + 8);
    std::memcpy(out, &f0, sizeof f0);
    std::memcpy(out + 8, &f1, sizeof f1);
    for (int64_t l = m; l < 16; ++l) out[l] = 0;  // lanes past n: nothing stored, nothing summed
    std::memcpy(probs + j, out, static_cast<size_t>(m) * sizeof(float));
    v8f g0, g1;
    std::memcpy(&g0, out, sizeof g0);
    std::memcpy(&g1, out + 8, sizeof g1);
    sum0 += __builtin_convertvector(g0, v8d);
    sum1 += __builtin_convertvector(g1, v8d);
  }
  const v8d s = sum0 + sum1;
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace shardlm::cpu
