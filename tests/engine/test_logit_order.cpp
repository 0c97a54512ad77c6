// LogitOrder (stable radix sort on descending keys) gives exactly the comparison sort's order on
// (logit desc, id asc): random logits of several vocabulary sizes, heavy ties, signed zeros,
// infinities, denormals and one-element rows; and the sampler's picks over a Qwen-sized row at many
// positions equal those of the comparison-sorted candidates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/logit_order.h"
#include "engine/rng.h"
#include "engine/sampler.h"

namespace shardlm {
namespace {

std::vector<int32_t> comparison_order(const std::vector<float>& l) {
  std::vector<int32_t> o(l.size());
  std::iota(o.begin(), o.end(), 0);
  std::sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  return o;
}

TEST(LogitOrder, KeysAreMonotone) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> ascending = {-inf, -3e38f, -1.5f, -1e-40f, 0.0f, 1e-40f, 1e-30f, 2.0f, 3e38f, inf};
  for (size_t i = 0; i + 1 < ascending.size(); ++i)
    EXPECT_GT(descending_key(ascending[i]), descending_key(ascending[i + 1])) << ascending[i];
  EXPECT_EQ(descending_key(-0.0f), descending_key(0.0f));
}

TEST(LogitOrder, SameOrderAsComparisonSort) {
  std::mt19937 g(3);
  LogitOrder sorter;
  std::vector<int32_t> got;
  for (int64_t n : {1, 2, 7, 255, 256, 257, 1000, 32000, 151936}) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<float> l(static_cast<size_t>(n));
      std::normal_distribution<float> d(0.0f, 3.0f);
      std::uniform_int_distribution<int> few(-3, 3);
      for (size_t i = 0; i < l.size(); ++i) {
        switch (kind) {
          case 0: l[i] = d(g); break;                                       // distinct, mixed signs
          case 1: l[i] = static_cast<float>(few(g)) * 0.5f; break;          // heavy ties
          case 2: l[i] = (i % 3 == 0) ? -0.0f : (i % 3 == 1 ? 0.0f : d(g)); break;  // signed zeros
          default:                                                          // extremes
            l[i] = (i % 5 == 0)   ? -std::numeric_limits<float>::infinity()
                   : (i % 5 == 1) ? 1e-42f
                   : (i % 5 == 2) ? -1e-42f
                                  : d(g) * 1e30f;
        }
      }
      sorter.sort(l.data(), n, &got);
      ASSERT_EQ(got, comparison_order(l)) << "n " << n << " kind " << kind;
    }
  }
}

TEST(LogitOrder, SamplerPicksMatchComparisonSortedCandidates) {
  // The reference: the sampler's algorithm on comparison-sorted candidates (no filters).
  std::mt19937 g(11);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> l(151936);
  for (float& x : l) x = d(g);
  for (size_t i = 0; i < l.size(); i += 97) l[i] = l[i / 2];  // some ties
  const std::vector<int32_t> order = comparison_order(l);
  Sampler s;
  SamplingParams p;
  p.temperature = 0.7;
  p.seed = 1234;
  const double inv_t = 1.0 / p.temperature;
  std::vector<float> probs(l.size());
  double mass = 0;
  for (size_t j = 0; j < l.size(); ++j) {
    probs[j] = static_cast<float>(std::exp((l[order[j]] - l[order[0]]) * inv_t));
    mass += probs[j];
  }
  for (int64_t pos = 0; pos < 300; ++pos) {
    const double u = static_cast<double>(uniform_at(p.seed, static_cast<uint64_t>(pos))) * mass;
    double cum = 0;
    size_t pick = l.size() - 1;
    for (size_t j = 0; j < l.size(); ++j) {
      cum += probs[j];
      if (u < cum) {
        pick = j;
        break;
      }
    }
    EXPECT_EQ(s.sample(l.data(), static_cast<int64_t>(l.size()), p, pos).token, order[pick]) << "position " << pos;
  }
}

}  // namespace
}  // namespace shardlm
