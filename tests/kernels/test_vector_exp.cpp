// exp16 (cpu/vector_exp.h) against the correctly rounded exp, and the softmax built on it
// (softmax_in_place, cpu/reduce_util.h) against a double-precision softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/reduce_util.h"
#include "cpu/vector_exp.h"
#include "common/float_bits.h"

using namespace shardlm::cpu::detail;

namespace {

using shardlm::test::bits;
using shardlm::test::from_bits;

// exp rounded once to float: double's exp is within 1 ulp of double, 2^29 times finer than float.
float exp_rounded(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

std::vector<float> exp16_all(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 16) {
    float in[16] = {}, out[16];
    for (size_t l = 0; l < 16 && i + l < x.size(); ++l) in[l] = x[i + l];
    store16(out, exp16(load16(in)));
    for (size_t l = 0; l < 16 && i + l < x.size(); ++l) y[i + l] = out[l];
  }
  return y;
}

}  // namespace

// Every 61st float from -110 to 90 (about 36 million): normal results within 1 ulp of the
// correctly rounded exp, subnormal results within 1 unit of the last subnormal place, and the
// overflow and underflow edges where they belong.
TEST(VectorExp, WithinOneUlpOfCorrectlyRounded) {
  std::vector<float> xs;
  for (uint32_t u = bits(-110.0f); u > 0x80000000u; u = u > 0x80000000u + 61 ? u - 61 : 0x80000000u) {
    xs.push_back(from_bits(u));
  }
  for (uint32_t u = 0; from_bits(u) <= 90.0f; u += 61) xs.push_back(from_bits(u));
  const std::vector<float> ys = exp16_all(xs);
  int64_t worst_normal = 0, worst_sub = 0, off_by_one = 0;
  float worst_x = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float want = exp_rounded(xs[i]);
    ASSERT_FALSE(std::signbit(ys[i])) << xs[i];
    const int64_t d = std::llabs(static_cast<int64_t>(bits(ys[i])) - static_cast<int64_t>(bits(want)));
    if (d > 0) ++off_by_one;
    if (want >= std::numeric_limits<float>::min()) {
      if (d > worst_normal) worst_normal = d, worst_x = xs[i];
    } else {
      worst_sub = std::max(worst_sub, d);
    }
  }
  std::printf(
      "exp16 on %zu floats in [-110, 90]: %lld not correctly rounded, worst %lld ulp (normal), %lld "
      "(subnormal)\n",
      xs.size(), static_cast<long long>(off_by_one), static_cast<long long>(worst_normal),
      static_cast<long long>(worst_sub));
  EXPECT_LE(worst_normal, 1) << "at x = " << worst_x;
  EXPECT_LE(worst_sub, 1);
  // Rounded correctly most of the time, not only within an ulp.
  EXPECT_LT(off_by_one, static_cast<int64_t>(xs.size()) / 20) << off_by_one << " of " << xs.size();
}

TEST(VectorExp, EdgesAndSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {0.0f,      -0.0f,    -inf,     inf,     std::nanf(""), 88.72283f, 88.7229f,
                                 -87.3365f, -103.28f, -103.98f, -200.0f, 1.0f,          -1.0f};
  const std::vector<float> ys = exp16_all(xs);
  EXPECT_EQ(ys[0], 1.0f);
  EXPECT_EQ(ys[1], 1.0f);
  EXPECT_EQ(ys[2], 0.0f);
  EXPECT_EQ(ys[3], inf);
  EXPECT_TRUE(std::isnan(ys[4]));
  EXPECT_TRUE(std::isfinite(ys[5])) << "exp(88.72283) is below FLT_MAX";
  EXPECT_EQ(ys[6], inf) << "exp(88.7229) is above FLT_MAX";
  EXPECT_GT(ys[7], 0.0f);
  EXPECT_GT(ys[8], 0.0f) << "the smallest subnormals are reached";
  EXPECT_EQ(ys[9], 0.0f);
  EXPECT_EQ(ys[10], 0.0f);
  EXPECT_EQ(ys[11], exp_rounded(1.0f));
  EXPECT_EQ(ys[12], exp_rounded(-1.0f));
}

// Within a few ulps of the double-precision softmax at every length around the 16-lane edges,
// for scores as attention makes them (spread over tens) and for a single dominant score.
TEST(VectorSoftmax, MatchesDoubleSoftmax) {
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.0f, 12.0f);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 33, 100, 512, 4099}) {
    for (int peaked = 0; peaked < 2; ++peaked) {
      std::vector<float> s(static_cast<size_t>(n));
      for (float& x : s) x = d(g);
      if (peaked) s[static_cast<size_t>(n / 2)] = 400.0f;
      std::vector<double> ref(s.begin(), s.end());
      double mx = -INFINITY, sum = 0;
      for (double x : ref) mx = std::max(mx, x);
      for (double& x : ref) sum += (x = std::exp(x - mx));
      softmax_in_place(s.data(), n);
      double total = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double want = ref[j] / sum;
        // Each exp's argument s_j - max is rounded to float first (as in any fp32 softmax): its
        // error, up to |s_j - max| * 2^-24, becomes a relative error of the result.
        const double arg_err = std::fabs(std::log(ref[j])) * 0x1p-24;
        EXPECT_NEAR(s[j], want, (4e-7 + arg_err) * want + 1e-37) << "n " << n << " j " << j;
        total += s[j];
      }
      EXPECT_NEAR(total, 1.0, 1e-5) << "n " << n;
      if (n == 1) {
        EXPECT_EQ(s[0], 1.0f);
      }
    }
  }
}

// The bits depend only on the scores: the same row gives the same bits wherever it lies in memory
// and whatever follows it; a padding token's empty row is left alone.
TEST(VectorSoftmax, BitsDependOnlyOnTheScores) {
  std::mt19937 g(9);
  std::normal_distribution<float> d(0.0f, 8.0f);
  std::vector<float> row(37);
  for (float& x : row) x = d(g);
  std::vector<float> a = row;
  softmax_in_place(a.data(), 37);
  for (int shift = 1; shift < 16; shift += 5) {
    std::vector<float> b(static_cast<size_t>(shift), 7.0f);
    b.insert(b.end(), row.begin(), row.end());
    b.push_back(1e30f);
    softmax_in_place(b.data() + shift, 37);
    EXPECT_EQ(std::memcmp(a.data(), b.data() + shift, a.size() * sizeof(float)), 0) << "shift " << shift;
    EXPECT_EQ(b.back(), 1e30f);
  }
  float untouched = 5.0f;
  softmax_in_place(&untouched, 0);
  EXPECT_EQ(untouched, 5.0f);
}

namespace {

std::vector<double> exp8d_all(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i += 8) {
    v8d in{};
    for (size_t l = 0; l < 8 && i + l < x.size(); ++l) in[l] = x[i + l];
    const v8d out = exp8d(in);
    for (size_t l = 0; l < 8 && i + l < x.size(); ++l) y[i + l] = out[l];
  }
  return y;
}

}  // namespace

// The double exponential against long double's: within 1.1 ulp over the whole range (the sampler's
// arguments are <= 0; the positive side is checked too), and rounded to float the same as libm's
// exp rounded to float on every one of 4 million arguments in [-120, 0].
TEST(VectorExp8d, WithinAnUlpAndTheSameFloats) {
  std::mt19937_64 g(7);
  std::uniform_real_distribution<double> wide(-708.0, 709.0), narrow(-120.0, 0.0);
  std::vector<double> x(1 << 20);
  for (double& v : x) v = wide(g);
  std::vector<double> y = exp8d_all(x);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const long double want = expl(static_cast<long double>(x[i]));
    const double ulp = std::nextafter(static_cast<double>(want), INFINITY) - static_cast<double>(want);
    worst = std::max(worst, static_cast<double>(fabsl(static_cast<long double>(y[i]) - want) / ulp));
  }
  EXPECT_LE(worst, 1.1);
  std::printf("[exp8d] worst error %.3f ulp over %zu arguments in [-708, 709]\n", worst, x.size());
  size_t differ = 0;
  for (int round = 0; round < 4; ++round) {
    for (double& v : x) v = narrow(g);
    y = exp8d_all(x);
    for (size_t i = 0; i < x.size(); ++i) differ += static_cast<float>(y[i]) != static_cast<float>(std::exp(x[i]));
  }
  EXPECT_EQ(differ, 0u) << "floats differing from libm's";
}

TEST(VectorExp8d, EdgesAndSpecialValues) {
  const std::vector<double> x = {0.0, -0.0, -1e-300, -745.2, -1e300, -INFINITY, NAN, 1.0, 709.0, -103.0, -104.5};
  const std::vector<double> y = exp8d_all(x);
  EXPECT_EQ(y[0], 1.0);
  EXPECT_EQ(y[1], 1.0);
  EXPECT_EQ(y[2], 1.0);
  for (int i : {3, 4, 5}) {
    EXPECT_GE(y[i], 0.0) << i;
    EXPECT_LT(y[i], 1e-300) << i;
    EXPECT_EQ(static_cast<float>(y[i]), 0.0f) << i;
  }
  EXPECT_TRUE(std::isnan(y[6]));
  EXPECT_LE(std::fabs(y[7] - std::exp(1.0)), 2.3e-16 * std::exp(1.0));  // 1 ulp
  EXPECT_NEAR(y[8] / std::exp(709.0), 1.0, 1e-15);
  EXPECT_EQ(static_cast<float>(y[9]), static_cast<float>(std::exp(-103.0)));  // a float subnormal
  EXPECT_EQ(static_cast<float>(y[10]), 0.0f);
}
