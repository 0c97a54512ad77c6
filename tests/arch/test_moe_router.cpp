// MoE routing on hand-computed cases: softmax top-k with and without renormalisation (Mixtral
// always renormalises), ties (lower index first), sigmoid group-limited top-k (the best single
// expert can sit in a dropped group), the correction bias (selection only, never the weights),
// normalisation and the routed scaling factor.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "arch/moe_router.h"
#include "core/error.h"

using namespace shardlm;

namespace {

// The logit whose sigmoid is s.
float logit(double s) { return static_cast<float>(std::log(s / (1 - s))); }

std::vector<int32_t> row_experts(const Routing& r, int64_t t) {
  return {r.experts.begin() + t * r.k, r.experts.begin() + (t + 1) * r.k};
}

}  // namespace

TEST(MoeRouter, SoftmaxTopKRenormalised) {
  const float x[] = {1, 2, 3, 0};
  Routing r;
  route_softmax_topk(x, 1, 4, 2, true, 1.0, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{2, 1}));
  // Renormalised top-2 of a softmax = softmax over the two logits: sigmoid(3 - 2).
  const double a = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(r.weights[0], a, 1e-7);
  EXPECT_NEAR(r.weights[1], 1 - a, 1e-7);
}

TEST(MoeRouter, SoftmaxTopKPlain) {
  const float x[] = {1, 2, 3, 0, /* token 1 */ -1, 0.5f, 0.25f, 4};
  Routing r;
  route_softmax_topk(x, 2, 4, 2, false, 1.0, &r);
  const double z0 = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + 1;
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / z0, 1e-7);
  EXPECT_NEAR(r.weights[1], std::exp(2.0) / z0, 1e-7);
  const double z1 = std::exp(-1.0) + std::exp(0.5) + std::exp(0.25) + std::exp(4.0);
  EXPECT_EQ(row_experts(r, 1), (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r.weights[2], std::exp(4.0) / z1, 1e-7);
  EXPECT_NEAR(r.weights[3], std::exp(0.5) / z1, 1e-7);
}

TEST(MoeRouter, TiesGoToTheLowerIndex) {
  const float x[] = {1, 1, 1, 1, /* */ 0, 2, 0, 2};
  Routing r;
  route_softmax_topk(x, 2, 4, 3, false, 1.0, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r.weights[0], 0.25f);
  EXPECT_EQ(row_experts(r, 1), (std::vector<int32_t>{1, 3, 0}));
  // Sigmoid path too, and between groups: groups 0 and 1 score the same, group 0 is kept.
  const float y[] = {0, 0, 0, 0};
  route_sigmoid_grouped(y, 1, 4, 2, nullptr, 2, 1, true, 1.0, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r.weights[0], 0.5f);
}

TEST(MoeRouter, MixtralAlwaysRenormalisesQwenOnlyWhenAsked) {
  const float x[] = {1, 2, 3, 0};
  MoeSpec m;
  m.num_experts = 4;
  m.experts_per_token = 2;
  m.norm_topk_prob = false;
  m.naming = MoeSpec::Naming::kMixtral;
  Routing r;
  route(m, x, 1, nullptr, &r);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-7);
  m.naming = MoeSpec::Naming::kQwen;
  route(m, x, 1, nullptr, &r);
  EXPECT_LT(r.weights[0] + r.weights[1], 0.95);
  m.norm_topk_prob = true;
  route(m, x, 1, nullptr, &r);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-7);
}

// 8 experts in 4 groups of 2, keep 2 groups, top-2. Expert 0 has the best single score (0.95) but
// its group (0.95 + 0.01) loses to groups 1 (0.7 + 0.5) and 2 (0.6 + 0.5).
TEST(MoeRouter, GroupLimitedDropsTheBestSingleExpert) {
  const double s[] = {0.95, 0.01, 0.7, 0.5, 0.5, 0.6, 0.1, 0.1};
  std::vector<float> x;
  for (double v : s) x.push_back(logit(v));
  Routing r;
  route_sigmoid_grouped(x.data(), 1, 8, 2, nullptr, 4, 2, true, 2.5, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{2, 5}));
  EXPECT_NEAR(r.weights[0], 0.7 / 1.3 * 2.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.6 / 1.3 * 2.5, 1e-6);
  // Without the group limit expert 0 wins.
  route_sigmoid_grouped(x.data(), 1, 8, 2, nullptr, 4, 4, true, 2.5, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(r.weights[0], 0.95 / 1.65 * 2.5, 1e-6);
  // norm_topk_prob off: the raw sigmoid scores, scaled.
  route_sigmoid_grouped(x.data(), 1, 8, 2, nullptr, 4, 2, false, 2.5, &r);
  EXPECT_NEAR(r.weights[0], 0.7 * 2.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.6 * 2.5, 1e-6);
}

// The bias moves expert 2 to the top and changes the group choice; weights stay unbiased.
TEST(MoeRouter, BiasSelectsButDoesNotWeigh) {
  const double s[] = {0.9, 0.8, 0.3, 0.2};
  std::vector<float> x;
  for (double v : s) x.push_back(logit(v));
  const float bias[] = {0, 0, 0.7f, 0};
  Routing r;
  // Kimi K2 style: one group.
  route_sigmoid_grouped(x.data(), 1, 4, 2, bias, 1, 1, true, 1.0, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{2, 0}));
  EXPECT_NEAR(r.weights[0], 0.3 / 1.2, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.9 / 1.2, 1e-6);
  route_sigmoid_grouped(x.data(), 1, 4, 2, bias, 1, 1, false, 1.0, &r);
  EXPECT_NEAR(r.weights[0], 0.3, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.9, 1e-6);
  // Two groups of two, keep one: group scores 1.7 and 0.5 unbiased, 1.7 and 1.8 biased, so group 0 is kept without
  // the bias and group 1 with it.
  route_sigmoid_grouped(x.data(), 1, 4, 2, nullptr, 2, 1, true, 1.0, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{0, 1}));
  const float bias2[] = {0, 0, 0.7f, 0.6f};
  route_sigmoid_grouped(x.data(), 1, 4, 2, bias2, 2, 1, true, 1.0, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.weights[0], 0.3 / 0.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.2 / 0.5, 1e-6);
  // route() uses the bias only when the spec says so.
  MoeSpec m;
  m.num_experts = 4;
  m.experts_per_token = 2;
  m.scoring = MoeSpec::Scoring::kSigmoid;
  m.n_group = 2;
  m.topk_group = 1;
  route(m, x.data(), 1, bias2, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{0, 1}));
  m.score_correction_bias = true;
  route(m, x.data(), 1, bias2, &r);
  EXPECT_EQ(row_experts(r, 0), (std::vector<int32_t>{2, 3}));
}

TEST(MoeRouter, EmptyAndInvalid) {
  Routing r;
  route_softmax_topk(nullptr, 0, 8, 2, true, 1.0, &r);
  EXPECT_EQ(r.experts.size(), 0u);
  route_sigmoid_grouped(nullptr, 0, 8, 2, nullptr, 4, 2, true, 1.0, &r);
  EXPECT_EQ(r.weights.size(), 0u);
  const float x[8] = {};
  EXPECT_THROW(route_softmax_topk(x, 1, 4, 5, true, 1.0, &r), Error);
  EXPECT_THROW(route_sigmoid_grouped(x, 1, 8, 2, nullptr, 3, 1, true, 1.0, &r), Error);  // 3 does not divide 8
  EXPECT_THROW(route_sigmoid_grouped(x, 1, 8, 5, nullptr, 4, 2, true, 1.0, &r), Error);  // 5 > 2 groups x 2
}
