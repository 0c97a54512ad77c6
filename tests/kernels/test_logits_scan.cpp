// argmax_logit and log_softmax_at (cpu/logits_scan.h) against plain loops in long double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/logits_scan.h"

using namespace shardlm;

namespace {

std::vector<float> normal_row(int64_t n, uint32_t seed, float sd) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = d(g);
  return x;
}

long double log_softmax_ref(const std::vector<float>& x, int64_t i) {
  long double mx = -INFINITY, sum = 0;
  for (float v : x) mx = std::max<long double>(mx, v);
  for (float v : x) sum += std::exp(static_cast<long double>(v) - mx);
  return static_cast<long double>(x[i]) - mx - std::log(sum);
}

}  // namespace

TEST(LogitsScan, ArgmaxFirstLargestAtEveryLaneAndLength) {
  for (int64_t n : {1, 2, 15, 16, 17, 33, 1000, 151936}) {
    std::vector<float> x = normal_row(n, 7, 3.0f);
    for (int64_t at : {int64_t{0}, n / 3, n - 1}) {
      std::vector<float> y = x;
      y[at] = 100.0f;
      EXPECT_EQ(cpu::argmax_logit(y.data(), n), at) << "n " << n;
      if (at + 5 < n) {  // a tie further on keeps the first
        y[at + 5] = 100.0f;
        EXPECT_EQ(cpu::argmax_logit(y.data(), n), at) << "n " << n;
      }
    }
  }
}

TEST(LogitsScan, ArgmaxSkipsNan) {
  std::vector<float> x = normal_row(37, 3, 1.0f);
  x[36] = 50.0f;
  for (int64_t at : {0, 5, 32, 35}) x[at] = std::nanf("");
  EXPECT_EQ(cpu::argmax_logit(x.data(), 37), 36);
  x[33] = 60.0f;  // in the tail lanes, beside NaN in the same lane group
  EXPECT_EQ(cpu::argmax_logit(x.data(), 37), 33);
  std::vector<float> nan_row(20, std::nanf(""));
  EXPECT_EQ(cpu::argmax_logit(nan_row.data(), 20), 0);
}

// Within one float rounding of the exact value for the largest vocabularies, for rows spread
// narrowly and widely, at the top token and at unlikely ones.
TEST(LogitsScan, LogSoftmaxWithinOneRoundingOfExact) {
  for (int64_t n : {1, 5, 16, 17, 32000, 151936, 163840}) {
    for (float sd : {0.5f, 4.0f, 20.0f}) {
      const std::vector<float> x = normal_row(n, static_cast<uint32_t>(n), sd);
      int64_t top = 0;
      for (int64_t j = 1; j < n; ++j) top = x[j] > x[top] ? j : top;
      for (int64_t i : {top, int64_t{0}, n / 2, n - 1}) {
        const long double want = log_softmax_ref(x, i);
        const float got = cpu::log_softmax_at(x.data(), n, i);
        EXPECT_NEAR(static_cast<long double>(got), want, std::fabs(want) * 0x1p-23L + 1e-7L)
            << "n " << n << " sd " << sd << " i " << i;
      }
    }
  }
  const std::vector<float> one = {3.5f};
  EXPECT_EQ(cpu::log_softmax_at(one.data(), 1, 0), 0.0f);
}

// The greedy path: argmax_logit's row maximum handed to log_softmax_at gives the bits of the
// scan that finds the maximum itself, with NaN in the row too.
TEST(LogitsScan, KnownMaximumGivesTheSameBits) {
  for (int64_t n : {1, 15, 16, 33, 32000, 151936}) {
    for (bool with_nan : {false, true}) {
      std::vector<float> x = normal_row(n, static_cast<uint32_t>(n + with_nan), 4.0f);
      if (with_nan)
        for (int64_t j = 0; j < n; j += 7) x[j] = NAN;
      float mx = 0;
      const int64_t top = cpu::argmax_logit(x.data(), n, &mx);
      float want_max = -INFINITY;
      for (float v : x) want_max = v > want_max ? v : want_max;
      EXPECT_EQ(mx, want_max) << "n " << n;
      for (int64_t i : {top, n - 1}) {
        const float a = cpu::log_softmax_at(x.data(), n, i), b = cpu::log_softmax_at(x.data(), n, i, mx);
        EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "n " << n << " i " << i << ": " << a << " vs " << b;
      }
    }
  }
}

// The sampler's probabilities: each the float libm's exp gives, for a Qwen-sized row in logit
// order at several temperatures; the sum within the sequential sum's own error bound (m roundings).
TEST(LogitsScan, TemperatureProbsAreLibmsFloats) {
  const int64_t n = 151936;
  const std::vector<float> x = normal_row(n, 3, 5.0f);
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) order[j] = static_cast<int32_t>(j);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (double t : {0.05, 0.7, 1.0, 2.5}) {
    for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{40}, n}) {
      std::vector<float> probs(static_cast<size_t>(m), -1.0f);
      const double top = x[order[0]];
      const double sum = cpu::temperature_probs(x.data(), order.data(), m, top, 1.0 / t, probs.data());
      size_t differ = 0;
      double want_sum = 0;
      for (int64_t j = 0; j < m; ++j) {
        const float want = static_cast<float>(std::exp((x[order[j]] - top) * (1.0 / t)));
        differ += probs[j] != want;
        want_sum += want;
      }
      EXPECT_EQ(differ, 0u) << "T " << t << " m " << m;
      EXPECT_NEAR(sum, want_sum, want_sum * static_cast<double>(m) * 0x1p-52) << "T " << t << " m " << m;
      EXPECT_EQ(probs[0], 1.0f);
    }
  }
}
