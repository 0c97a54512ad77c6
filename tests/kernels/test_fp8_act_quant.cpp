// Activations quantised to e4m3 in 128-feature blocks (kernels/cpu/fp8_act_quant.h), the input of
// the W8A8 GEMMs: every block's largest magnitude becomes 448 exactly, every other value its
// nearest e4m3 multiple of the block scale, the scales land token-contiguous at the stride asked
// for, a partial last block and an all-zero block are handled, and nothing past the rows and the
// stride is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/fp8_act_quant.h"
#include "fp8_bits.h"

namespace shardlm {
namespace {

TEST(Fp8ActQuant, BlocksScaleToTheirLargestMagnitude) {
  const int64_t M = 5, K = 300, L = 3, ld = 8;  // blocks of 128, 128 and 44 features
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x[m * K + k] = d(g) * std::ldexp(1.0f, static_cast<int>(m * 7) - 14);
  std::fill_n(&x[3 * K + 128], 128, 0.0f);  // row 3's middle block is all zeros
  std::vector<uint8_t> q(x.size(), 0xaa);
  std::vector<float> s(static_cast<size_t>(L * ld), -1.0f);
  cpu::fp8_act_quant(x.data(), M, K, q.data(), s.data(), ld);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < L; ++b) {
      SCOPED_TRACE(::testing::Message() << "row " << m << " block " << b);
      const int64_t k0 = b * 128, k1 = std::min(K, k0 + 128);
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[m * K + k]));
      const float scale = s[b * ld + m];
      if (amax == 0.0f) {
        EXPECT_EQ(scale, 1.0f);
        for (int64_t k = k0; k < k1; ++k) EXPECT_EQ(q[m * K + k] & 0x7f, 0);
        continue;
      }
      EXPECT_EQ(scale, amax / 448.0f);
      bool hit_max = false;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = x[m * K + k], back = fp8_bits::to_f32(q[m * K + k]) * scale;
        hit_max = hit_max || std::fabs(fp8_bits::to_f32(q[m * K + k])) == 448.0f;
        // Nearest e4m3: within half a step (2^-4 relative for normals, 2^-10 of the scale below).
        EXPECT_LE(std::fabs(back - v), std::max(std::fabs(v) * 0.0625f, scale * std::ldexp(1.0f, -10)) * 1.0001f)
            << "k " << k;
        // And no nearer code exists: the neighbours of the code are not closer.
        const uint8_t c = q[m * K + k];
        for (int dc : {-1, 1}) {
          const int n = (c & 0x7f) + dc;
          if (n < 0 || n > 0x7e) continue;
          const float other = fp8_bits::to_f32(static_cast<uint8_t>((c & 0x80) | n)) * scale;
          EXPECT_GE(std::fabs(other - v), std::fabs(back - v)) << "k " << k;
        }
      }
      EXPECT_TRUE(hit_max);
    }
  for (int64_t b = 0; b < L; ++b)
    for (int64_t m = M; m < ld; ++m) EXPECT_EQ(s[b * ld + m], -1.0f) << "stride padding written";
}

// A block whose largest magnitude is below 448 x the smallest subnormal: amax / 448 underflows to
// 0, and the scale must not (0 / 0 would make its zeros NaN codes). It takes the smallest
// subnormal: the zeros stay zeros and the value keeps its sign and size.
TEST(Fp8ActQuant, AScaleThatWouldUnderflowTakesTheSmallestSubnormal) {
  const float tiny = std::ldexp(1.0f, -147);  // 4 x the smallest subnormal
  ASSERT_GT(tiny, 0.0f);
  ASSERT_EQ(tiny / 448.0f, 0.0f);
  EXPECT_EQ(fp8_bits::act_scale(tiny), std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(fp8_bits::act_scale(0.0f), 1.0f);
  EXPECT_EQ(fp8_bits::act_scale(448.0f), 1.0f);
  std::vector<float> x(128, 0.0f);
  x[5] = -tiny;
  std::vector<uint8_t> q(128, 0xaa);
  float scale = -1;
  cpu::fp8_act_quant(x.data(), 1, 128, q.data(), &scale, 1);
  EXPECT_EQ(scale, std::numeric_limits<float>::denorm_min());
  for (int k = 0; k < 128; ++k) {
    if (k == 5) continue;
    EXPECT_EQ(q[k] & 0x7f, 0) << "k " << k;
  }
  EXPECT_EQ(fp8_bits::to_f32(q[5]), -4.0f);
  EXPECT_EQ(fp8_bits::to_f32(q[5]) * scale, -tiny);
}

}  // namespace
}  // namespace shardlm
