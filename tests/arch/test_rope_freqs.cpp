// rope_inv_freq / rope_attention_factor / attention_softmax_scale: YaRN against the formula of
// transformers' _compute_yarn_parameters recomputed here in double, and against values printed
// by transformers 5.24 itself (golden, below); the default and rotary-dimension overloads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "arch/rope_freqs.h"

using namespace shardlm;

namespace {

ModelSpec yarn_spec(double theta, double factor, int64_t orig, double mscale, double mscale_all_dim) {
  ModelSpec s;
  s.head_dim = 128;  // deliberately not the rotary dimension
  s.rope_theta = theta;
  s.rope_scaling.kind = RopeScaling::Kind::kYarn;
  s.rope_scaling.factor = factor;
  s.rope_scaling.original_max_position_embeddings = orig;
  s.rope_scaling.beta_fast = 32;
  s.rope_scaling.beta_slow = 1;
  s.rope_scaling.mscale = mscale;
  s.rope_scaling.mscale_all_dim = mscale_all_dim;
  return s;
}

// The YaRN formula in double: extrapolated frequencies below the ramp, interpolated above.
std::vector<double> yarn_formula(double base, double factor, double orig, double beta_fast, double beta_slow,
                                 int64_t dim) {
  auto corr = [&](double rot) { return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(base)); };
  double low = std::max(std::floor(corr(beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<double> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double pf = std::pow(base, 2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv[i] = (1 / (factor * pf)) * ramp + (1 / pf) * (1 - ramp);
  }
  return inv;
}

double mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * want[i]) << "i=" << i;
}

}  // namespace

TEST(RopeFreqs, DefaultOverRotaryDim) {
  ModelSpec s;
  s.head_dim = 16;
  s.rope_theta = 10000;
  const auto a = rope_inv_freq(s);
  ASSERT_EQ(a.size(), 8u);
  const auto b = rope_inv_freq(s, 64);
  ASSERT_EQ(b.size(), 32u);
  for (int64_t i = 0; i < 32; ++i) EXPECT_NEAR(b[i], std::pow(10000.0, -2.0 * i / 64), 1e-6 * b[i]);
  EXPECT_EQ(a, rope_inv_freq(s, 16));
  EXPECT_EQ(rope_attention_factor(s), 1.0);
  EXPECT_FLOAT_EQ(attention_softmax_scale(s, 192), static_cast<float>(1 / std::sqrt(192.0)));
}

TEST(RopeFreqs, YarnDeepseekV3MatchesFormula) {
  // DeepSeek-V3: theta 1e4, factor 40, original 4096, beta 32/1, mscale = mscale_all_dim = 1.
  const ModelSpec s = yarn_spec(10000, 40, 4096, 1.0, 1.0);
  const auto got = rope_inv_freq(s, 64);
  const auto want = yarn_formula(10000, 40, 4096, 32, 1, 64);
  expect_close(got, want, 2e-6);
  // The three regions are all present: kept, blended, divided by the factor.
  EXPECT_NEAR(got[0], 1.0, 1e-7);
  EXPECT_NEAR(got[31], std::pow(10000.0, -62.0 / 64) / 40, 1e-6 * got[31]);
  int blended = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const double pf = std::pow(10000.0, 2.0 * i / 64);
    if (got[i] < 0.999 / pf && got[i] > 1.001 / (40 * pf)) ++blended;
  }
  EXPECT_GT(blended, 3);
  EXPECT_DOUBLE_EQ(rope_attention_factor(s), 1.0);
  EXPECT_FLOAT_EQ(attention_softmax_scale(s, 192),
                  static_cast<float>(std::pow(192.0, -0.5) * mscale(40, 1) * mscale(40, 1)));
}

TEST(RopeFreqs, YarnAttentionFactorVariants) {
  // mscale and mscale_all_dim both set: their ratio; only one of them: get_mscale(factor).
  const ModelSpec a = yarn_spec(50000, 32, 4096, 0.707, 1.0);
  EXPECT_NEAR(rope_attention_factor(a), mscale(32, 0.707) / mscale(32, 1.0), 1e-15);
  const ModelSpec b = yarn_spec(10000, 4, 64, 1.0, 0.0);
  EXPECT_NEAR(rope_attention_factor(b), mscale(4, 1.0), 1e-15);
  EXPECT_FLOAT_EQ(attention_softmax_scale(b, 136), static_cast<float>(std::pow(136.0, -0.5)));  // no mscale_all_dim
  const ModelSpec c = yarn_spec(10000, 1.0, 64, 1.0, 1.0);  // factor 1: no correction at all
  EXPECT_DOUBLE_EQ(rope_attention_factor(c), 1.0);
  EXPECT_FLOAT_EQ(attention_softmax_scale(c, 192), static_cast<float>(std::pow(192.0, -0.5)));
  expect_close(rope_inv_freq(b, 8), yarn_formula(10000, 4, 64, 32, 1, 8), 2e-6);
}

// Llama 3.1's settings (theta 5e5, factor 8, low/high frequency factors 1 and 4, 8192 original
// positions, 128 dims), printed by transformers 5.25's _compute_llama3_parameters: bit-identical.
TEST(RopeFreqs, Llama3MatchesTransformersBitForBit) {
  const std::vector<float> want = {
      0x1.0000000000000p+0f,  0x1.a115820000000p-1f,  0x1.53c38c0000000p-1f,  0x1.14c7080000000p-1f,
      0x1.c2ef780000000p-2f,  0x1.6f56fa0000000p-2f,  0x1.2b3dc60000000p-2f,  0x1.e788c20000000p-3f,
      0x1.8d27600000000p-3f,  0x1.4387400000000p-3f,  0x1.078d400000000p-3f,  0x1.ad63380000000p-4f,
      0x1.5dc95a0000000p-4f,  0x1.1cf1300000000p-4f,  0x1.d03cce0000000p-5f,  0x1.7a2d080000000p-5f,
      0x1.3411900000000p-5f,  0x1.f5ea7e0000000p-6f,  0x1.98de920000000p-6f,  0x1.4d12720000000p-6f,
      0x1.0f53860000000p-6f,  0x1.ba0dd80000000p-7f,  0x1.681ada0000000p-7f,  0x1.2558fe0000000p-7f,
      0x1.ddee9e0000000p-8f,  0x1.8554ec0000000p-8f,  0x1.3d28040000000p-8f,  0x1.025c6a0000000p-8f,
      0x1.a4ee400000000p-9f,  0x1.1bfa0c0000000p-9f,  0x1.67a23a0000000p-10f, 0x1.c12f3c0000000p-11f,
      0x1.132ba40000000p-11f, 0x1.47e2100000000p-12f, 0x1.765ba40000000p-13f, 0x1.90d10c0000000p-14f,
      0x1.46831a0000000p-14f, 0x1.09fb7e0000000p-14f, 0x1.b159020000000p-15f, 0x1.6103320000000p-15f,
      0x1.1f91f00000000p-15f, 0x1.d484de0000000p-16f, 0x1.7da9e80000000p-16f, 0x1.36e8ea0000000p-16f,
      0x1.fa8b860000000p-17f, 0x1.9ca3ea0000000p-17f, 0x1.5024d60000000p-17f, 0x1.11d41e0000000p-17f,
      0x1.be21880000000p-18f, 0x1.6b6d0e0000000p-18f, 0x1.280d960000000p-18f, 0x1.e257000000000p-19f,
      0x1.88ec200000000p-19f, 0x1.4014d20000000p-19f, 0x1.04be680000000p-19f, 0x1.a8d0100000000p-20f,
      0x1.5a0f4e0000000p-20f, 0x1.19e8000000000p-20f, 0x1.cb4a9a0000000p-21f, 0x1.76258e0000000p-21f,
      0x1.30c94e0000000p-21f, 0x1.f091840000000p-22f, 0x1.9483600000000p-22f, 0x1.4985fe0000000p-22f,
  };
  ModelSpec s;
  s.head_dim = 128;
  s.rope_theta = 500000.0;
  s.rope_scaling.kind = RopeScaling::Kind::kLlama3;
  s.rope_scaling.factor = 8.0;
  s.rope_scaling.low_freq_factor = 1.0;
  s.rope_scaling.high_freq_factor = 4.0;
  s.rope_scaling.original_max_position_embeddings = 8192;
  const std::vector<float> got = rope_inv_freq(s);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "i=" << i;
}

// Printed by transformers 5.24 (DeepseekV3Config with these rope_parameters, _compute_yarn_parameters
// and DeepseekV3Attention.scaling with qk_head_dim 192 / 136).
TEST(RopeFreqs, YarnMatchesTransformersGolden) {
  const std::vector<float> v3 = {
      0x1.0000000000000p+0f, 0x1.7ff2220000000p-1f, 0x1.1feb340000000p-1f, 0x1.afd1360000000p-2f,
      0x1.43d1360000000p-2f, 0x1.e5a8460000000p-3f, 0x1.6c310e0000000p-3f, 0x1.111aee0000000p-3f,
      0x1.99999a0000000p-4f, 0x1.33281a0000000p-4f, 0x1.ccab840000000p-5f, 0x1.3f8b740000000p-5f,
      0x1.b864360000000p-6f, 0x1.2d1b860000000p-6f, 0x1.97e5060000000p-7f, 0x1.111aee0000000p-7f,
      0x1.6872b20000000p-8f, 0x1.d2e0cc0000000p-9f, 0x1.26d42c0000000p-9f, 0x1.67459a0000000p-10f,
      0x1.9e7c6e0000000p-11f, 0x1.b326240000000p-12f, 0x1.74eea60000000p-13f, 0x1.17a8e20000000p-15f,
      0x1.a36e2e0000000p-16f, 0x1.3a87460000000p-16f, 0x1.d7b9e00000000p-17f, 0x1.61bea20000000p-17f,
      0x1.0945660000000p-17f, 0x1.8dd9ba0000000p-18f, 0x1.2a58840000000p-18f, 0x1.bf749e0000000p-19f};
  const std::vector<float> kimi_like = {
      0x1.0000000000000p+0f, 0x1.6d1ce60000000p-1f, 0x1.045db60000000p-1f, 0x1.7356fe0000000p-2f,
      0x1.08ce7a0000000p-2f, 0x1.79ac460000000p-3f, 0x1.0d52a20000000p-3f, 0x1.801d360000000p-4f,
      0x1.11ea820000000p-4f, 0x1.6720880000000p-5f, 0x1.d336f20000000p-6f, 0x1.2d199a0000000p-6f,
      0x1.7fb0260000000p-7f, 0x1.e1fa7e0000000p-8f, 0x1.292d300000000p-8f, 0x1.657b260000000p-9f,
      0x1.9f347c0000000p-10f, 0x1.c931920000000p-11f, 0x1.cb8c020000000p-12f, 0x1.7cd9880000000p-13f,
      0x1.2f2b100000000p-15f, 0x1.b0629e0000000p-16f, 0x1.3456b60000000p-16f, 0x1.b7c26e0000000p-17f,
      0x1.3998ee0000000p-17f, 0x1.bf42700000000p-18f, 0x1.3ef21a0000000p-18f, 0x1.c6e3300000000p-19f,
      0x1.4462a20000000p-19f, 0x1.cea5400000000p-20f, 0x1.49eaea0000000p-20f, 0x1.d6892c0000000p-21f};
  const std::vector<float> small = {0x1.0p+0f, 0x1.0p-4f, 0x1.47ae14p-9f, 0x1.0624dep-12f};
  struct Case {
    ModelSpec spec;
    int64_t dim, qk;
    const std::vector<float>* inv;
    double af, scaling;
  };
  const Case cases[] = {
      {yarn_spec(10000, 40, 4096, 1.0, 1.0), 64, 192, &v3, 1.0, 0.1352337788608801},
      {yarn_spec(50000, 32, 4096, 0.707, 1.0), 64, 192, &kimi_like, 0.9245892963555604, 0.13086079996295005},
      {yarn_spec(10000, 4, 64, 1.0, 0.0), 8, 136, &small, 1.138629436111989, 0.08574929257125442},
  };
  for (const Case& c : cases) {
    const auto got = rope_inv_freq(c.spec, c.dim);
    ASSERT_EQ(got.size(), c.inv->size());
    // Bit-exact but for the fp32 pow, which may differ by an ulp from torch's.
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LE(std::fabs(got[i] - (*c.inv)[i]), std::ldexp(std::fabs((*c.inv)[i]), -23)) << "i=" << i;
    EXPECT_NEAR(rope_attention_factor(c.spec), c.af, 1e-15);
    EXPECT_EQ(attention_softmax_scale(c.spec, c.qk), static_cast<float>(c.scaling));
  }
}
