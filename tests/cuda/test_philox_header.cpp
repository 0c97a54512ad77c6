// kernels/philox.h (the Philox shared by the host and the device samplers) draws exactly what
// src/engine/rng.cpp draws. Runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "engine/rng.h"
#include "philox.h"

namespace shardlm {
namespace {

TEST(PhiloxHeader, BlocksEqualRngCpp) {
  std::mt19937_64 gen(7);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t a = gen(), b = gen(), c = gen();
    const uint32_t c0 = static_cast<uint32_t>(a), c1 = static_cast<uint32_t>(a >> 32);
    const uint32_t c2 = static_cast<uint32_t>(b), c3 = static_cast<uint32_t>(b >> 32);
    const uint32_t k0 = static_cast<uint32_t>(c), k1 = static_cast<uint32_t>(c >> 32);
    const Philox4x32 want = philox4x32_10(c0, c1, c2, c3, k0, k1);
    const rng::Philox4 got = rng::philox4x32_10(c0, c1, c2, c3, k0, k1);
    for (int w = 0; w < 4; ++w) ASSERT_EQ(got.v[w], want.v[w]) << "draw " << i << " word " << w;
  }
}

TEST(PhiloxHeader, UniformEqualsRngCpp) {
  std::mt19937_64 gen(11);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t seed = i < 100 ? static_cast<uint64_t>(i) : gen();
    const uint64_t position = i % 3 == 0 ? static_cast<uint64_t>(i) : gen();
    const uint32_t draw = static_cast<uint32_t>(i % 5);
    const float want = uniform_at(seed, position, draw);
    const float got = rng::uniform_at(seed, position, draw);
    ASSERT_EQ(got, want) << "seed " << seed << " position " << position << " draw " << draw;
    ASSERT_GE(got, 0.0f);
    ASSERT_LT(got, 1.0f);
  }
  EXPECT_EQ(rng::uniform_at(0, 0), uniform_at(0, 0));
}

}  // namespace
}  // namespace shardlm
