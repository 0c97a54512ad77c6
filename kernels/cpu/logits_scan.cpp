#include "cpu/logits_scan.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/vec16.h"
#include "cpu/vector_exp.h"
#include "sample_rules.h"

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

// sum_j exp(x[j] - mx): fp32 exponentials summed in fp64, in a fixed order; `tail` holds the row's
// last n % 16 logits padded with -inf.
double exp_sum_with(const float* x, int64_t n, float mx, const float* tail) {
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
  return sum;
}

float log_softmax_from(float xi, float mx, double sum) {
  return static_cast<float>(static_cast<double>(xi) - mx - std::log(sum));
}

// x[i] - mx - log(sum_j exp(x[j] - mx)).
float log_softmax_with(const float* x, int64_t n, int64_t i, float mx, const float* tail) {
  return log_softmax_from(x[i], mx, exp_sum_with(x, n, mx, tail));
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

void top_logprobs(const float* x, int64_t n, int k, int32_t* ids, float* logprobs) {
  // The k first candidates kept sorted by key; once k are held, only a logit above the k-th's can
  // enter (an equal one has a larger id).
  if (k <= 0) return;
  if (k > kMaxTop) throw std::invalid_argument("top_logprobs: k above " + std::to_string(kMaxTop));
  uint64_t keys[kMaxTop];
  int m = 0;
  float floor = -INFINITY;
  auto consider = [&](int64_t j) {
    const float v = x[j];
    if (m == k ? !(v > floor) : v != v) return;  // NaN never enters
    const uint64_t key = sampling::candidate_key(v, static_cast<uint32_t>(j));
    int at = m < k ? m++ : k - 1;
    for (; at > 0 && keys[at - 1] > key; --at) keys[at] = keys[at - 1];
    keys[at] = key;
    if (m == k) floor = x[keys[k - 1] & 0xffffffffu];
  };
  // Sixteen at a time: a group with no logit above the floor (most of them, once k are held) is
  // skipped at one vector compare.
  const int64_t full = n / 16 * 16;
  for (int64_t j = 0; j < full; j += 16) {
    if (m == k) {
      const v16i above = load16(x + j) > (v16f{} + floor);
      int any = 0;
      for (int l = 0; l < 16; ++l) any |= above[l];
      if (!any) continue;
    }
    for (int64_t i = j; i < j + 16; ++i) consider(i);
  }
  for (int64_t i = full; i < n; ++i) consider(i);
  float tail[16];
  const float mx = detail::max16(x, n, tail);
  const double sum = m > 0 ? exp_sum_with(x, n, mx, tail) : 0.0;
  for (int i = 0; i < k; ++i) {
    const bool held = i < m;
    ids[i] = held ? static_cast<int32_t>(keys[i] & 0xffffffffu) : -1;
    logprobs[i] = held ? log_softmax_from(x[ids[i]], mx, sum) : NAN;
  }
}

namespace {

using detail::v8d;
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

v8f probs8(v8f a, v8d top, v8d inv_t) {
  const v8f p = __builtin_convertvector(detail::exp8d((__builtin_convertvector(a, v8d) - top) * inv_t), v8f);
  return p == p ? p : v8f{};  // a NaN logit weighs nothing
}

// Probabilities of n logits, load(j) giving the 8 from j on (lanes past n unread): two groups of 8
// per round, independent exponentials for the core to overlap. Vectors only, no local arrays: under
// ASan's fake stack (detect_stack_use_after_return) a local array the compiler had aligned for
// vector stores lost that alignment and the stores faulted.
template <typename Load>
void probs_by_8(int64_t n, double top, double inv_t, Load load, float* probs) {
  const v8d vtop = v8d{} + top, vinv = v8d{} + inv_t;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const v8f p0 = probs8(load(j, 8), vtop, vinv), p1 = probs8(load(j + 8, 8), vtop, vinv);
    std::memcpy(probs + j, &p0, sizeof p0);
    std::memcpy(probs + j + 8, &p1, sizeof p1);
  }
  for (; j < n; j += 8) {
    const int64_t m = n - j < 8 ? n - j : 8;
    const v8f p = probs8(load(j, m), vtop, vinv);
    for (int64_t l = 0; l < m; ++l) probs[j + l] = p[l];
  }
}

}  // namespace

void temperature_bands(const float* x, int64_t n, double top, double inv_t, uint16_t* band) {
  const v8d vtop = v8d{} + top, scale = v8d{} - inv_t * kBandsPerNat, last = v8d{} + (kBands - 1);
  typedef uint16_t v8s __attribute__((vector_size(16)));
  auto bands8 = [&](v8f a) {
    // (x - top) * -8/T >= 0; a NaN fails the comparison and lands in the last band.
    const v8d b = (__builtin_convertvector(a, v8d) - vtop) * scale;
    return __builtin_convertvector(__builtin_convertvector(b < last ? b : last, v8i), v8s);
  };
  const int64_t full = n / 8 * 8;
  for (int64_t j = 0; j < full; j += 8) {
    v8f a;
    std::memcpy(&a, x + j, sizeof a);
    const v8s b = bands8(a);
    std::memcpy(band + j, &b, sizeof b);
  }
  if (full < n) {
    v8f a{};
    for (int64_t l = 0; l < n - full; ++l) a[l] = x[full + l];
    const v8s b = bands8(a);
    for (int64_t l = 0; l < n - full; ++l) band[full + l] = b[l];
  }
}

int64_t band_members(const uint16_t* band, int64_t n, int lo, int hi, int32_t* ids) {
  typedef uint16_t v32s __attribute__((vector_size(64)));
  typedef uint64_t v8u __attribute__((vector_size(64)));
  // Unsigned: a band below lo wraps past the span.
  const uint16_t lo16 = static_cast<uint16_t>(lo), span = static_cast<uint16_t>(hi - lo);
  int64_t m = 0;
  auto scalar = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      ids[m] = static_cast<int32_t>(i);
      m += static_cast<uint16_t>(band[i] - lo16) <= span;
    }
  };
  const int64_t full = n / 32 * 32;
  for (int64_t j = 0; j < full; j += 32) {
    v32s v;
    std::memcpy(&v, band + j, sizeof v);
    const v8u hit = reinterpret_cast<v8u>(static_cast<v32s>(v - lo16) <= span);
    if (((hit[0] | hit[1]) | (hit[2] | hit[3])) == 0 && ((hit[4] | hit[5]) | (hit[6] | hit[7])) == 0) continue;
    scalar(j, j + 32);
  }
  scalar(full, n);
  return m;
}

void tempered_probs(const float* x, int64_t n, double top, double inv_t, float* probs) {
  probs_by_8(
      n, top, inv_t,
      [x](int64_t j, int64_t m) {
        v8f a{};
        if (m == 8) {
          std::memcpy(&a, x + j, sizeof a);
        } else {
          for (int64_t l = 0; l < m; ++l) a[l] = x[j + l];
        }
        return a;
      },
      probs);
}

void tempered_probs_at(const float* x, const int32_t* ids, int64_t n, double top, double inv_t, float* probs) {
  probs_by_8(
      n, top, inv_t,
      [x, ids](int64_t j, int64_t m) {
        v8f a{};
        for (int64_t l = 0; l < m; ++l) a[l] = x[ids[j + l]];
        return a;
      },
      probs);
}

}  // namespace shardlm::cpu
