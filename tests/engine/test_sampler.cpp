#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compute/backend.h"
#include "core/error.h"
#include "cpu/logits_scan.h"
#include "engine/rng.h"
#include "engine/sampler.h"
#include "engine/seen_tokens.h"
#include "cpu/logit_edits.h"
#include "sample_rules.h"

namespace shardlm {
namespace {

int32_t cpu_argmax(const std::vector<float>& l) {
  int32_t best = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i] > l[best] || std::isnan(l[best])) best = static_cast<int32_t>(i);
  }
  return best;
}

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

// vLLM's order: min-p before top-p, so top-p's mass is what min-p left. Probabilities 0.5, 0.3 and
// five of 0.04: min-p 0.1 drops the five (0.04 < 0.1 x 0.5), leaving 0.625 / 0.375, and top-p 0.6
// then keeps the first alone. top-p first would keep two (0.5 < 0.6 <= 0.8) and draw the second
// 3 times in 8.
TEST(Sampler, MinPCutsBeforeTopP) {
  std::vector<float> l = {std::log(0.5f), std::log(0.3f)};
  for (int i = 0; i < 5; ++i) l.push_back(std::log(0.04f));
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.6;
  p.min_p = 0.1;
  p.seed = 11;
  Sampler s;
  std::map<int32_t, int> seen;
  for (int pos = 0; pos < 2000; ++pos) ++seen[s.sample(l.data(), 7, p, pos).token];
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], 2000);
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

// The rule of sampler.h written the plainest way: the whole row comparison-sorted once, libm's
// exp, integer prefix sums walked in order. picks(p, n) gives the tokens at positions 0..n-1.
class ReferenceSampler {
 public:
  explicit ReferenceSampler(const std::vector<float>& l) : l_(l), order_(l.size()) {
    std::iota(order_.begin(), order_.end(), 0);
    auto rank = [&](int32_t i) { return std::isnan(l_[i]) ? -INFINITY : l_[i]; };
    std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return rank(a) > rank(b); });
  }

  std::vector<int32_t> picks(const SamplingParams& p, int64_t positions) const {
    const double top = std::isnan(l_[order_[0]]) ? -INFINITY : l_[order_[0]];
    if (!std::isfinite(top)) return std::vector<int32_t>(static_cast<size_t>(positions), order_[0]);
    const int64_t V = static_cast<int64_t>(l_.size());
    std::vector<float> prob(l_.size());
    std::vector<int64_t> w(l_.size());
    for (int64_t j = 0; j < V; ++j) {
      const float x = l_[order_[j]];
      const double d = (static_cast<double>(x) - top) * (1.0 / p.temperature);
      prob[j] = std::isnan(x) ? 0.0f : static_cast<float>(std::exp(d));
      w[j] = prob[j] > 0 ? static_cast<int64_t>(static_cast<double>(prob[j]) * 0x1p40) : 0;
    }
    int64_t n = V;
    if (p.top_k > 0 && p.top_k < V) n = p.top_k;
    // vLLM's order: top-k and min-p (both keep a prefix), then top-p over what they left.
    if (p.min_p > 0.0) {
      int64_t last = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (prob[j] >= p.min_p * static_cast<double>(prob[0])) last = j;
      }
      n = last + 1;
    }
    if (p.top_p < 1.0) {
      const int64_t mass = std::accumulate(w.begin(), w.begin() + n, int64_t{0});
      int64_t cum = 0;
      for (int64_t j = 0; j < n; ++j) {
        cum += w[j];
        if (static_cast<double>(cum) >= p.top_p * static_cast<double>(mass)) {
          n = j + 1;
          break;
        }
      }
    }
    const int64_t mass = std::accumulate(w.begin(), w.begin() + n, int64_t{0});
    std::vector<int32_t> out;
    for (int64_t pos = 0; pos < positions; ++pos) {
      const double u =
          static_cast<double>(uniform_at(p.seed, static_cast<uint64_t>(pos))) * static_cast<double>(mass);
      int64_t cum = 0, j = 0;
      while (j < n - 1) {
        cum += w[j];
        if (static_cast<double>(cum) > u) break;
        ++j;
      }
      out.push_back(order_[j]);
    }
    return out;
  }

 private:
  const std::vector<float>& l_;
  std::vector<int32_t> order_;
};

// Rows of many shapes (wide and narrow spreads, heavy ties, one value everywhere, -inf and NaN
// entries, a few tokens far ahead of the rest, rows without a finite maximum; one to 151936
// tokens) under temperature, top-k, top-p and min-p in combination: the sampler's token is the
// reference's at every position, and its logprob the row's log-softmax.
TEST(Sampler, FollowsTheReferenceRuleExactly) {
  std::mt19937 g(2024);
  const double temps[] = {0.05, 0.7, 1.0, 2.5};
  const int64_t vocabs[] = {1, 2, 5, 100, 1000, 32000, 151936};
  Sampler s;
  int64_t checked = 0, off_top = 0;
  for (int64_t V : vocabs) {
    for (int kind = 0; kind < 10; ++kind) {
      std::vector<float> l(static_cast<size_t>(V));
      std::normal_distribution<float> wide(0.0f, 4.0f), narrow(0.0f, 0.02f);
      std::uniform_int_distribution<int> few(-3, 3);
      for (size_t i = 0; i < l.size(); ++i) {
        switch (kind) {
          case 0: l[i] = wide(g); break;
          case 1: l[i] = narrow(g); break;                                 // almost flat
          case 2: l[i] = static_cast<float>(few(g)) * 1.5f; break;          // heavy ties
          case 3: l[i] = 2.0f; break;                                       // all equal
          case 4: l[i] = i % 7 == 3 ? -INFINITY : wide(g) * 3.0f; break;    // -inf among a wide spread
          case 5: l[i] = i % 11 == 5 ? std::nanf("") : wide(g); break;     // NaN among them
          case 6: l[i] = wide(g) * 0.5f + (i % 997 == 1 ? 14.0f : 0.0f); break;  // a few far ahead
          case 7: l[i] = std::nanf(""); break;                             // no maximum at all
          case 8: l[i] = i % 13 == 2 ? INFINITY : wide(g); break;          // +inf: not finite
          default: l[i] = i == 0 ? std::nanf("") : -INFINITY; break;       // nothing above -inf
        }
      }
      const ReferenceSampler ref(l);
      for (int combo = 0; combo < 12; ++combo) {
        SamplingParams p;
        p.temperature = temps[combo % 4];
        p.seed = g();
        const int64_t ks[] = {0, 0, 1, 5, 50, V - 1};
        p.top_k = ks[std::uniform_int_distribution<int>(0, 5)(g)];
        const double tps[] = {1.0, 1.0, 0.95, 0.5, 1e-9};
        p.top_p = tps[std::uniform_int_distribution<int>(0, 4)(g)];
        const double mps[] = {0.0, 0.0, 0.01, 0.3, 1.0, 1e-15};  // the last below 2^-40
        p.min_p = mps[std::uniform_int_distribution<int>(0, 5)(g)];
        const std::vector<int32_t> want = ref.picks(p, 25);
        for (int64_t pos = 0; pos < 25; ++pos) {
          const Sample got = s.sample(l.data(), V, p, pos);
          ASSERT_EQ(got.token, want[pos])
              << "V " << V << " kind " << kind << " T " << p.temperature << " top_k " << p.top_k << " top_p "
              << p.top_p << " min_p " << p.min_p << " position " << pos;
          const float want_lp = log_softmax_at(l.data(), V, got.token);  // NaN for a row holding NaN
          ASSERT_TRUE(got.logprob == want_lp || (std::isnan(got.logprob) && std::isnan(want_lp)));
          ++checked;
          off_top += got.token != cpu_argmax(l);
        }
      }
    }
  }
  EXPECT_EQ(checked, 7 * 10 * 12 * 25);
  EXPECT_GT(off_top, checked / 8);  // the draws reach past the most likely token
}

// Above 2^22 tokens the weights could overflow their 64-bit sums: a clear error, not a wrong token.
TEST(Sampler, RefusesVocabulariesPastTheWeightBound) {
  Sampler s;
  SamplingParams p;
  p.temperature = 1.0;
  std::vector<float> l(static_cast<size_t>(sampling::kMaxVocab + 1), 0.0f);
  try {
    s.sample(l.data(), static_cast<int64_t>(l.size()), p, 0);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary of 4194305"), std::string::npos) << e.what();
  }
  p.temperature = 0.0;  // greedy sums nothing
  EXPECT_EQ(s.sample(l.data(), static_cast<int64_t>(l.size()), p, 0).token, 0);
}

// The CPU backend samples its rows in an OpenMP region, which an exception may not leave
// (std::terminate, with no message and no job abort): the error reaches the caller.
TEST(Sampler, BackendRowsErrorReachesTheCaller) {
  const std::unique_ptr<ComputeBackend> cpu = make_backend("cpu");
  const int64_t V = sampling::kMaxVocab + 1, R = 4;
  std::vector<float> l(static_cast<size_t>(V * R), 0.0f);
  std::vector<SampleRow> rows(static_cast<size_t>(R));
  for (SampleRow& r : rows) r.temperature = 1.0;
  rows[0].temperature = 0.0;  // a greedy row does not fail
  std::vector<int32_t> tokens(static_cast<size_t>(R), -1);
  std::vector<float> logprobs(static_cast<size_t>(R));
  try {
    cpu->sample(l.data(), R, V, rows.data(), nullptr, tokens.data(), logprobs.data(), nullptr, nullptr);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary of 4194305"), std::string::npos) << e.what();
  }
}

// vLLM's logit controls in its sampler's order, on exactly representable values: the allowed mask,
// then the bias (min_tokens' -inf, logit_bias), then the penalties of a seen token, which read the
// biased logit (token 1: (2 + 2) / 2 = 2, where the penalty first would give 3).
TEST(Sampler, LogitControlsAsVllmAppliesThem) {
  const std::vector<float> l = {1.0f, 2.0f, -1.0f, 3.0f, 0.5f, 4.0f};
  std::vector<TokenEdit> edits = {
      {1, 1, 2.0f, 1},       // seen in the output once, biased, allowed
      {2, -1, 1.5f, 1},      // unseen, biased: no penalty
      {3, 0, -INFINITY, 0},  // a stop token barred before min_tokens (also in the prompt)
      {4, -1, 0.0f, 1},      // allowed only
  };
  std::vector<float> got(l.size());
  cpu::edited_row(l.data(), 6, edits.data(), 4, false, 2.0f, 0.0f, 0.0f, got.data());
  EXPECT_EQ(got, (std::vector<float>{1.0f, 2.0f, 0.5f, -INFINITY, 0.5f, 4.0f}));
  // Keeping only the allowed tokens: tokens 0, 3 and 5 are barred, listed or not.
  cpu::edited_row(l.data(), 6, edits.data(), 4, true, 2.0f, 0.0f, 0.0f, got.data());
  EXPECT_EQ(got, (std::vector<float>{-INFINITY, 2.0f, 0.5f, -INFINITY, 0.5f, -INFINITY}));
  EXPECT_THROW(cpu::edited_row(l.data(), 3, edits.data(), 4, false, 1.0f, 0.0f, 0.0f, got.data()), std::out_of_range);

  // Through the sampler, greedy: the raw argmax is token 5; kept to the allowed tokens, token 1;
  // the logprob stays the raw row's.
  Sampler s;
  SampleRow row;
  row.repetition_penalty = 2.0f;
  row.edits_count = 4;
  EXPECT_EQ(s.sample(l.data(), 6, row, edits.data()).token, 5);
  row.allowed_only = true;
  ASSERT_TRUE(row.edited());
  const Sample out = s.sample(l.data(), 6, row, edits.data());
  EXPECT_EQ(out.token, 1);
  EXPECT_FLOAT_EQ(out.logprob, log_softmax_at(l.data(), 6, 1));
  // Sampled rows keep to the allowed tokens whatever the seed.
  row.temperature = 1.5;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    row.seed = seed;
    const int32_t t = s.sample(l.data(), 6, row, edits.data()).token;
    EXPECT_TRUE(t == 1 || t == 2 || t == 4) << "seed " << seed << ": token " << t;
  }
}

// vLLM's penalties, against the rule written out here in double on exactly representable values
// (so the fp32 of both sides is exact): repetition on prompt and output tokens (a positive logit
// divided, any other multiplied), then frequency x output count and presence on output tokens.
TEST(Sampler, PenaltiesAsVllmAppliesThem) {
  const std::vector<float> l = {4.0f, 3.0f, -1.0f, 2.5f, 0.0f, 1.0f};
  // Token 0: prompt only; 1: output twice; 2: prompt and output once; 3: unseen; 4: output once.
  const std::vector<TokenEdit> seen = {{0, 0}, {1, 2}, {2, 1}, {4, 1}};
  const double rep = 2.0, freq = 0.25, pres = 0.5;
  std::vector<double> want(l.begin(), l.end());
  want[0] = 4.0 / rep;
  want[1] = 3.0 / rep - freq * 2 - pres;
  want[2] = -1.0 * rep - freq - pres;
  want[4] = 0.0 * rep - freq - pres;
  std::vector<float> got(l.size());
  cpu::edited_row(l.data(), 6, seen.data(), 4, false, 2.0f, 0.25f, 0.5f, got.data());
  for (size_t i = 0; i < l.size(); ++i) EXPECT_EQ(static_cast<double>(got[i]), want[i]) << "token " << i;
  for (size_t i = 0; i < l.size(); ++i) {
    EXPECT_EQ(static_cast<double>(sampling::penalized_logit(l[i], 2.0f, 0.25f, 0.5f, 0)),
              l[i] > 0 ? l[i] / 2.0 : l[i] * 2.0)
        << "as a prompt token: repetition only";
  }

  // Through the sampler: greedy takes the penalized argmax (token 3, 2.5 > 2), its logprob is the
  // raw row's; the same row without penalties takes token 0.
  Sampler s;
  SampleRow row;
  row.repetition_penalty = 2.0f;
  row.frequency_penalty = 0.25f;
  row.presence_penalty = 0.5f;
  row.edits_count = 4;
  ASSERT_TRUE(row.edited());
  Sample out = s.sample(l.data(), 6, row, seen.data());
  EXPECT_EQ(out.token, 3);
  EXPECT_FLOAT_EQ(out.logprob, log_softmax_at(l.data(), 6, 3));
  row.edits_count = 0;  // nothing seen: nothing to penalize
  EXPECT_FALSE(row.edited());
  EXPECT_EQ(s.sample(l.data(), 6, row, nullptr).token, 0);
  // Neutral values leave every seen token's logit as it is.
  SampleRow neutral;
  neutral.edits_count = 4;
  EXPECT_EQ(s.sample(l.data(), 6, neutral, seen.data()).token, 0);
  cpu::edited_row(l.data(), 6, seen.data(), 4, false, 1.0f, 0.0f, 0.0f, got.data());
  EXPECT_EQ(got, l);

  // A repetition penalty below 1 favours what was seen, and a sampled row chooses on the penalized
  // row too: on a flat row the seen token's 1 becomes 2.
  row = SampleRow{};
  row.repetition_penalty = 0.5f;
  std::vector<float> flat = {1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<TokenEdit> seen_last = {{3, 0}};
  row.edits_count = 1;
  row.temperature = 0.05;  // 1 / 0.5 = 2 against 1: e^20 more likely
  for (int64_t pos = 0; pos < 50; ++pos) {
    row.position = pos;
    EXPECT_EQ(s.sample(flat.data(), 4, row, seen_last.data()).token, 3) << pos;
  }

  // A seen token outside the vocabulary is an error, not a write past the row.
  const std::vector<TokenEdit> outside = {{6, 1}};
  row = SampleRow{};
  row.presence_penalty = 1.0f;
  row.edits_count = 1;
  EXPECT_THROW(s.sample(l.data(), 6, row, outside.data()), std::out_of_range);
}

// The seen tokens a sequence's penalties read: distinct, in order of first appearance, each with
// its count in the output, brought up to date incrementally.
TEST(SeenTokens, CountsOutputOccurrencesOfDistinctTokens) {
  SeenTokens seen;
  std::vector<int32_t> tokens = {5, 7, 5, 9};  // the prompt
  seen.update(tokens, 4);
  auto as_pairs = [&] {
    std::vector<std::pair<int32_t, int32_t>> v;
    for (const TokenEdit& t : seen.list()) v.emplace_back(t.token, t.output_count);
    return v;
  };
  using P = std::vector<std::pair<int32_t, int32_t>>;
  EXPECT_EQ(as_pairs(), (P{{5, 0}, {7, 0}, {9, 0}}));
  tokens.push_back(7);
  tokens.push_back(11);
  seen.update(tokens, 4);
  tokens.push_back(7);
  seen.update(tokens, 4);
  seen.update(tokens, 4);  // nothing new: nothing counted twice
  EXPECT_EQ(as_pairs(), (P{{5, 0}, {7, 2}, {9, 0}, {11, 1}}));
  tokens.pop_back();
  EXPECT_THROW(seen.update(tokens, 4), std::exception);  // a sequence only grows
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
  bad.max_tokens = 0;  // vLLM's bound: at least one token
  EXPECT_EQ(bad.validate(), "max_tokens must be >= 1");
  // vLLM's temperature bound: above 0 and below 1e-2 raised to 1e-2 (before its greedy test, so
  // only 0 is greedy), negative refused.
  for (const auto& [asked, used] : std::vector<std::pair<double, double>>{
           {0.0, 0.0}, {5e-6, 1e-2}, {1e-5, 1e-2}, {0.005, 1e-2}, {0.01, 0.01}, {0.5, 0.5}}) {
    o.temperature = asked;
    EXPECT_DOUBLE_EQ(d.resolved(o, "r").temperature, used) << asked;
  }
  o.temperature = -0.5;
  EXPECT_EQ(d.resolved(o, "r").validate(), "temperature must be in [0, 2]");
  o.temperature = 2.0;  // vLLM's upper bound, included
  EXPECT_TRUE(d.resolved(o, "r").validate().empty());
  o.temperature = 2.01;
  EXPECT_EQ(d.resolved(o, "r").validate(), "temperature must be in [0, 2]");
  o.temperature = 0.5;
  // vLLM's penalty bounds: repetition finite and > 0, frequency and presence in [-2, 2].
  SamplingOverrides pen = o;
  pen.repetition_penalty = 1.2;
  pen.frequency_penalty = -2.0;
  pen.presence_penalty = 2.0;
  const SamplingParams penalized = d.resolved(pen, "r");
  EXPECT_TRUE(penalized.validate().empty()) << penalized.validate();
  EXPECT_TRUE(penalized.penalized());
  EXPECT_FALSE(d.penalized());
  const SampleRow row = sample_row(penalized, 3);
  EXPECT_EQ(row.repetition_penalty, 1.2f);
  EXPECT_EQ(row.frequency_penalty, -2.0f);
  EXPECT_EQ(row.presence_penalty, 2.0f);
  for (double bad_rep : {0.0, -1.0, static_cast<double>(INFINITY), static_cast<double>(NAN)}) {
    SamplingParams b = penalized;
    b.repetition_penalty = bad_rep;
    EXPECT_NE(b.validate().find("repetition_penalty"), std::string::npos) << bad_rep;
  }
  for (double bad_pen : {-2.01, 2.5, static_cast<double>(NAN)}) {
    SamplingParams b = penalized;
    b.frequency_penalty = bad_pen;
    EXPECT_NE(b.validate().find("frequency_penalty"), std::string::npos) << bad_pen;
    b = penalized;
    b.presence_penalty = bad_pen;
    EXPECT_NE(b.validate().find("presence_penalty"), std::string::npos) << bad_pen;
  }
  SamplingParams low = d;
  low.temperature = 0.001;  // the run's --temperature too
  EXPECT_DOUBLE_EQ(low.resolved(SamplingOverrides{}, "r").temperature, 1e-2);
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

// The reference: every token that is not NaN, sorted by logit descending and id ascending.
std::vector<int32_t> sorted_candidates(const std::vector<float>& l) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < l.size(); ++i)
    if (!std::isnan(l[i])) ids.push_back(static_cast<int32_t>(i));
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  return ids;
}

// vLLM's logprobs N: a row's N most likely tokens of the raw logits, ties to the lower id, NaN
// never, with the same logprob as the chosen token's; and prompt_logprobs' scored rows, which take
// their given token.
TEST(Sampler, TopLogprobsAndScoredRows) {
  std::mt19937 g(11);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (int64_t V : {1, 5, 17, 1000, 32000}) {
    std::vector<float> l(static_cast<size_t>(V));
    for (float& x : l) x = d(g);
    // Ties, a NaN, infinities and the rounding of a quantised head.
    if (V >= 17) {
      l[3] = l[9] = l[12] = 50.0f;
      l[4] = NAN;
      l[5] = -INFINITY;
      l[16] = l[2];
    }
    const std::vector<int32_t> want = sorted_candidates(l);
    for (int k : {1, 3, 20}) {
      std::vector<int32_t> ids(static_cast<size_t>(k), 99);
      std::vector<float> lps(static_cast<size_t>(k));
      cpu::top_logprobs(l.data(), V, k, ids.data(), lps.data());
      for (int i = 0; i < k; ++i) {
        if (i < static_cast<int>(want.size())) {
          EXPECT_EQ(ids[i], want[i]) << "V " << V << " k " << k << " at " << i;
          // The same bits as the chosen token's logprob (NaN where the row holds a NaN, as there).
          const float ref = log_softmax_at(l.data(), V, want[i]);
          EXPECT_TRUE(lps[i] == ref || (std::isnan(lps[i]) && std::isnan(ref))) << "V " << V << " at " << i;
        } else {
          EXPECT_EQ(ids[i], -1) << "V " << V << ": fewer tokens than asked";
          EXPECT_TRUE(std::isnan(lps[i]));
        }
      }
    }
    if (V >= 17) {
      std::vector<int32_t> ids(3);
      std::vector<float> lps(3);
      cpu::top_logprobs(l.data(), V, 3, ids.data(), lps.data());
      EXPECT_EQ(ids, (std::vector<int32_t>{3, 9, 12}));  // the three equal largest, by id
    }
  }
  // Through the backend: a sampled row with its alternatives, a scored row, one without either.
  const int64_t V = 64;
  std::vector<float> l(static_cast<size_t>(3 * V));
  for (float& x : l) x = d(g);
  std::vector<SampleRow> rows(3);
  rows[0].top_n = 4;
  rows[1].target = 17;
  rows[1].top_n = 2;
  rows[1].top_begin = 4;
  rows[2].temperature = 0.7;
  rows[2].top_begin = 6;
  std::vector<int32_t> tokens(3), top(6, -7);
  std::vector<float> logprobs(3), top_lps(6);
  const std::unique_ptr<ComputeBackend> cpu = make_backend("cpu");
  cpu->sample(l.data(), 3, V, rows.data(), nullptr, tokens.data(), logprobs.data(), top.data(), top_lps.data());
  const std::vector<float> r0(l.begin(), l.begin() + V), r1(l.begin() + V, l.begin() + 2 * V);
  const std::vector<int32_t> c0 = sorted_candidates(r0), c1 = sorted_candidates(r1);
  EXPECT_EQ(tokens[0], c0[0]);  // greedy: the first alternative
  EXPECT_EQ(std::vector<int32_t>(top.begin(), top.begin() + 4), std::vector<int32_t>(c0.begin(), c0.begin() + 4));
  EXPECT_EQ(top_lps[0], logprobs[0]);
  EXPECT_EQ(tokens[1], 17);
  EXPECT_EQ(logprobs[1], log_softmax_at(r1.data(), V, 17));
  EXPECT_EQ(std::vector<int32_t>(top.begin() + 4, top.end()), std::vector<int32_t>(c1.begin(), c1.begin() + 2));
  // A scored token outside the vocabulary, or more alternatives than vLLM allows, is refused.
  rows[1].target = static_cast<int32_t>(V);
  EXPECT_THROW(
      cpu->sample(l.data(), 3, V, rows.data(), nullptr, tokens.data(), logprobs.data(), top.data(), top_lps.data()),
      Error);
  rows[1].target = 1;
  rows[2].top_n = kMaxTopLogprobs + 1;
  std::vector<int32_t> big(64);
  std::vector<float> big_lps(64);
  EXPECT_THROW(
      cpu->sample(l.data(), 3, V, rows.data(), nullptr, tokens.data(), logprobs.data(), big.data(), big_lps.data()),
      Error);
}

}  // namespace
}  // namespace shardlm
