#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "engine/sampler.h"

namespace shardlm {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(Sampler, GreedyPicksArgmaxLowestOnTies) {
  Sampler s;
  SamplingParams p;
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  Sample out = s.sample(l.data(), 4, p, 0);
  EXPECT_EQ(out.token, 1);
  EXPECT_NEAR(out.logprob, log_softmax_at(l.data(), 4, 1), 1e-6);
  // log_softmax against a direct computation
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(out.logprob, 3.0 - std::log(z), 1e-5);
}

// Sampling at temperature 1 reproduces the distribution (chi-square over 40000 positions).
TEST(Sampler, TemperatureOneFollowsDistribution) {
  Sampler s;
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 99;
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  auto l = logits_of(probs);
  std::vector<int> counts(4, 0);
  const int n = 40000;
  for (int pos = 0; pos < n; ++pos) ++counts[s.sample(l.data(), 4, p, pos).token];
  double chi2 = 0;
  for (int i = 0; i < 4; ++i) {
    const double e = probs[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 16.27);  // p = 0.001 for 3 degrees of freedom
}

TEST(Sampler, TopKTopPMinPRestrictSupport) {
  Sampler s;
  const std::vector<double> probs = {0.4, 0.3, 0.2, 0.06, 0.04};
  auto l = logits_of(probs);
  SamplingParams base;
  base.temperature = 1.0;
  base.seed = 5;
  auto support = [&](const SamplingParams& p) {
    std::map<int, int> seen;
    for (int pos = 0; pos < 5000; ++pos) ++seen[s.sample(l.data(), 5, p, pos).token];
    return seen;
  };
  SamplingParams k = base;
  k.top_k = 2;
  auto sk = support(k);
  EXPECT_EQ(sk.size(), 2u);
  EXPECT_TRUE(sk.count(0) && sk.count(1));
  SamplingParams tp = base;
  tp.top_p = 0.75;  // 0.4 + 0.3 = 0.7 < 0.75 -> needs the third
  auto sp = support(tp);
  EXPECT_EQ(sp.size(), 3u);
  EXPECT_FALSE(sp.count(3));
  SamplingParams mp = base;
  mp.min_p = 0.5;  // keeps p >= 0.2
  auto sm = support(mp);
  EXPECT_EQ(sm.size(), 3u);
  EXPECT_FALSE(sm.count(3) || sm.count(4));
}

TEST(Sampler, SameSeedAndPositionSameToken) {
  Sampler a, b;
  SamplingParams p;
  p.temperature = 0.8;
  p.seed = 1234;
  std::vector<float> l(1000);
  for (int i = 0; i < 1000; ++i) l[i] = static_cast<float>(std::sin(i * 0.37) * 3);
  for (int pos = 0; pos < 200; ++pos) EXPECT_EQ(a.sample(l.data(), 1000, p, pos).token, b.sample(l.data(), 1000, p, pos).token);
  // A different seed gives a different stream.
  SamplingParams q = p;
  q.seed = 4321;
  int differ = 0;
  for (int pos = 0; pos < 200; ++pos) differ += a.sample(l.data(), 1000, p, pos).token != b.sample(l.data(), 1000, q, pos).token;
  EXPECT_GT(differ, 50);
}

TEST(SamplingParams, ValidateAndResolve) {
  SamplingParams d;
  d.seed = 42;
  SamplingOverrides o;
  o.temperature = 0.7;
  o.max_tokens = 9;
  SamplingParams r = d.resolved(o, "req-1");
  EXPECT_DOUBLE_EQ(r.temperature, 0.7);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.seed, d.resolved(o, "req-1").seed);
  EXPECT_NE(r.seed, d.resolved(o, "req-2").seed);
  o.seed = 5;
  EXPECT_EQ(d.resolved(o, "req-1").seed, 5u);
  EXPECT_TRUE(r.validate().empty());
  SamplingParams bad = r;
  bad.temperature = NAN;
  EXPECT_FALSE(bad.validate().empty());
  bad = r;
  bad.top_p = 0;
  EXPECT_FALSE(bad.validate().empty());
  bad = r;
  bad.min_p = -0.1;
  EXPECT_FALSE(bad.validate().empty());
  bad = r;
  bad.max_tokens = -1;
  EXPECT_FALSE(bad.validate().empty());
}

}  // namespace
}  // namespace shardlm
