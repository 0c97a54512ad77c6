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

// The sampler's probabilities: each the float libm's exp gives, for a Qwen-sized row at several
// temperatures, at every length modulo the 16-wide groups, in index order and gathered; each band
// the floor of 8 nats below the top (the last band for the far tail), never decreasing along the
// candidate order; and from kWeightlessBand on, every probability below 2^-40.
TEST(LogitsScan, TemperedProbsAreLibmsFloatsInBands) {
  const int64_t n = 151936;
  std::vector<float> x = normal_row(n, 3, 5.0f);
  x[17] = -INFINITY;
  const float top = *std::max_element(x.begin(), x.end());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) ids[j] = static_cast<int32_t>((j * 7919) % n);  // a permutation
  for (double t : {0.05, 0.7, 1.0, 2.5}) {
    for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{40}, n}) {
      std::vector<float> probs(static_cast<size_t>(m), -1.0f), gathered(static_cast<size_t>(m), -1.0f);
      std::vector<uint16_t> band(static_cast<size_t>(m), 9999);
      cpu::tempered_probs(x.data(), m, top, 1.0 / t, probs.data());
      cpu::tempered_probs_at(x.data(), ids.data(), m, top, 1.0 / t, gathered.data());
      cpu::temperature_bands(x.data(), m, top, 1.0 / t, band.data());
      size_t differ = 0, gather_differ = 0, band_differ = 0, heavy_tail = 0;
      for (int64_t j = 0; j < m; ++j) {
        const double d = (static_cast<double>(x[j]) - top) * (1.0 / t);
        differ += probs[j] != static_cast<float>(std::exp(d));
        gather_differ += gathered[j] != static_cast<float>(std::exp((static_cast<double>(x[ids[j]]) - top) * (1.0 / t)));
        const double want_band = std::min(std::floor(-d * cpu::kBandsPerNat), double{cpu::kBands - 1});
        band_differ += band[j] != static_cast<uint16_t>(want_band);
        heavy_tail += band[j] >= cpu::kWeightlessBand && probs[j] >= 0x1p-40f;
      }
      EXPECT_EQ(differ, 0u) << "T " << t << " m " << m;
      EXPECT_EQ(gather_differ, 0u) << "T " << t << " m " << m;
      EXPECT_EQ(band_differ, 0u) << "T " << t << " m " << m;
      EXPECT_EQ(heavy_tail, 0u) << "T " << t << " m " << m;
    }
  }
  std::vector<float> probs(static_cast<size_t>(n));
  std::vector<uint16_t> band(static_cast<size_t>(n));
  cpu::tempered_probs(x.data(), n, top, 1.0 / 0.7, probs.data());
  cpu::temperature_bands(x.data(), n, top, 1.0 / 0.7, band.data());
  EXPECT_EQ(probs[std::max_element(x.begin(), x.end()) - x.begin()], 1.0f);
  EXPECT_EQ(probs[17], 0.0f);
  EXPECT_EQ(band[17], cpu::kBands - 1);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) order[j] = j;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (int64_t j = 1; j < n; ++j) ASSERT_LE(band[order[j - 1]], band[order[j]]) << "at " << j;
  // The weightless band's edge itself: exp(-27.75) is below 2^-40.
  const float edge[2] = {0.0f, -27.75f};
  float pe[2];
  uint16_t be[2];
  cpu::tempered_probs(edge, 2, 0.0, 1.0, pe);
  cpu::temperature_bands(edge, 2, 0.0, 1.0, be);
  EXPECT_EQ(be[1], cpu::kWeightlessBand);
  EXPECT_LT(pe[1], 0x1p-40f);
  // NaN: probability 0 (no weight), the last band.
  const float nan_row[3] = {std::nanf(""), 0.0f, -1.0f};
  float p3[3];
  uint16_t b3[3];
  cpu::tempered_probs(nan_row, 3, 0.0, 1.0, p3);
  cpu::temperature_bands(nan_row, 3, 0.0, 1.0, b3);
  EXPECT_EQ(p3[0], 0.0f);
  EXPECT_EQ(b3[0], cpu::kBands - 1);
  EXPECT_EQ(p3[1], 1.0f);
  EXPECT_EQ(b3[1], 0);
  EXPECT_EQ(b3[2], cpu::kBandsPerNat);
}
