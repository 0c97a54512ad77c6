// LogitOrder (stable radix sort on descending keys) gives exactly the comparison sort's order on
// (logit desc, id asc): whole rows of several vocabulary sizes (random logits, heavy ties, signed
// zeros, infinities, denormals, one element) and subsets gathered in id order, NaN ranked as -inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/logit_order.h"
#include "sample_rules.h"

namespace shardlm {
namespace {

std::vector<int32_t> comparison_order(const std::vector<float>& l) {
  std::vector<int32_t> o(l.size());
  std::iota(o.begin(), o.end(), 0);
  std::sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  return o;
}

// The candidate key's logit half: ascending in it is descending in x.
uint32_t descending_key(float x) { return static_cast<uint32_t>(sampling::candidate_key(x, 0) >> 32); }

TEST(LogitOrder, KeysAreMonotone) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> ascending = {-inf, -3e38f, -1.5f, -1e-40f, 0.0f, 1e-40f, 1e-30f, 2.0f, 3e38f, inf};
  for (size_t i = 0; i + 1 < ascending.size(); ++i)
    EXPECT_GT(descending_key(ascending[i]), descending_key(ascending[i + 1])) << ascending[i];
  EXPECT_EQ(descending_key(-0.0f), descending_key(0.0f));
  EXPECT_EQ(descending_key(std::nanf("")), descending_key(-inf));
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
      std::vector<uint64_t> keys(l.size());
      for (size_t i = 0; i < l.size(); ++i) keys[i] = sampling::candidate_key(l[i], static_cast<uint32_t>(i));
      sorter.sort_keys(&keys);
      got.clear();
      for (uint64_t k : keys) got.push_back(static_cast<int32_t>(k & 0xffffffffu));
      ASSERT_EQ(got, comparison_order(l)) << "n " << n << " kind " << kind;
    }
  }
}

TEST(LogitOrder, SortKeysGivesTheOrderOfASubset) {
  // Keys gathered in id order (as the sampler's bands gather them), small and large subsets.
  std::mt19937 g(5);
  std::uniform_int_distribution<int> few(-4, 4);
  std::vector<float> l(40000);
  for (float& x : l) x = static_cast<float>(few(g)) * 0.25f;
  l[3] = std::nanf("");
  LogitOrder sorter;
  for (int every : {1, 3, 100}) {
    std::vector<uint64_t> keys;
    std::vector<int32_t> want;
    for (size_t i = 0; i < l.size(); i += static_cast<size_t>(every)) {
      keys.push_back(sampling::candidate_key(l[i], static_cast<uint32_t>(i)));
      want.push_back(static_cast<int32_t>(i));
    }
    std::sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
      const float x = std::isnan(l[a]) ? -INFINITY : l[a], y = std::isnan(l[b]) ? -INFINITY : l[b];
      return x > y || (x == y && a < b);
    });
    sorter.sort_keys(&keys);
    ASSERT_EQ(keys.size(), want.size());
    for (size_t j = 0; j < keys.size(); ++j) ASSERT_EQ(static_cast<int32_t>(keys[j] & 0xffffffffu), want[j]) << j;
  }
}

}  // namespace
}  // namespace shardlm
