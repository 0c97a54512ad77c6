#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/rng.h"

namespace shardlm {
namespace {

// Known-answer vectors of Philox4x32-10 published with the Random123 library (kat_vectors).
TEST(Philox, KnownAnswerZero) {
  Philox4x32 r = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerOnes) {
  Philox4x32 r = philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
}

TEST(Philox, KnownAnswerPi) {
  Philox4x32 r = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(UniformAt, PureFunctionOfSeedAndPosition) {
  EXPECT_EQ(uniform_at(7, 100), uniform_at(7, 100));
  EXPECT_NE(uniform_at(7, 100), uniform_at(7, 101));
  EXPECT_NE(uniform_at(7, 100), uniform_at(8, 100));
}

TEST(UniformAt, RangeAndMoments) {
  const int n = 200000;
  double sum = 0, sq = 0;
  std::vector<int> bins(10, 0);
  for (int i = 0; i < n; ++i) {
    const float u = uniform_at(12345, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sq += u * u;
    ++bins[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sq / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
  for (int b : bins) EXPECT_NEAR(b, n / 10, n / 10 * 0.03);
}

}  // namespace
}  // namespace shardlm
