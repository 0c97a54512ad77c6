// Rows on a bf16 wire (kernels/cpu/wire_bf16.h) through the CPU backend's pack_bf16 / unpack_bf16:
// the rounded part of each block comes back as torch's bf16 rounding of it (nearest even, ties
// both ways, NaN quiet, infinities and the largest finite values kept), and the whole part, the
// int32 meta of a captured exchange's block, comes back bit for bit; the packed layout is the
// documented one, block by block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compute/backend.h"
#include "cpu/wire_bf16.h"
#include "common/float_bits.h"

using namespace shardlm;

namespace {

using test::bits;
using test::from_bits;

// Values whose bf16 rounding is known without the code under test: (input bits, bf16 bits).
const std::pair<uint32_t, uint16_t> kKnown[] = {
    {0x3f800000u, 0x3f80},  // 1
    {0x3f808000u, 0x3f80},  // 1 + 2^-8: a tie, to the even 1
    {0x3f818000u, 0x3f82},  // 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
    {0x3f808001u, 0x3f81},  // just past the tie: up
    {0x3f807fffu, 0x3f80},  // just below it: down
    {0xbf808001u, 0xbf81},  // the same, negative
    {0x00000000u, 0x0000},  // +0
    {0x80000000u, 0x8000},  // -0
    {0x00000001u, 0x0000},  // the smallest subnormal: to zero
    {0x7f7fffffu, 0x7f80},  // the largest float: rounds to infinity, as torch does
    {0x7f800000u, 0x7f80},  // +inf
    {0xff800000u, 0xff80},  // -inf
    {0x7fa00000u, 0x7fe0},  // a signalling NaN: quiet, payload's top kept
    {0xffc00001u, 0xffc0},  // a negative quiet NaN
};

TEST(CpuWireBf16, RoundsLikeTorchAndKeepsWholeWords) {
  auto b = make_backend("cpu");
  const int64_t n_known = static_cast<int64_t>(std::size(kKnown));
  // Two blocks: the known values rounded, then 3 whole words (meta: -1, 0x12345678, a NaN pattern).
  const int64_t round_len = n_known, block_len = n_known + 3, blocks = 2;
  const uint32_t whole[] = {0xffffffffu, 0x12345678u, 0x7fa00001u};
  const auto word = [&](int64_t j, int64_t blk) { return static_cast<uint32_t>(whole[j] + static_cast<uint32_t>(blk)); };
  std::vector<float> src(static_cast<size_t>(blocks * block_len));
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t j = 0; j < n_known; ++j) src[blk * block_len + j] = from_bits(kKnown[j].first ^ (blk << 31));
    for (int64_t j = 0; j < 3; ++j) src[blk * block_len + round_len + j] = from_bits(word(j, blk));
  }
  const int64_t wire = cpu::wire_bf16_len(block_len, round_len);
  ASSERT_EQ(wire, n_known + 6);
  std::vector<uint16_t> packed(static_cast<size_t>(blocks * wire), 0xdead);
  b->pack_bf16(src.data(), blocks, block_len, round_len, packed.data());
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint16_t* p = packed.data() + blk * wire;
    for (int64_t j = 0; j < n_known; ++j) {
      const uint16_t want = static_cast<uint16_t>(kKnown[j].second ^ (blk << 15));
      EXPECT_EQ(p[j], want) << "block " << blk << " value " << j;
    }
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(p[round_len + 2 * j], word(j, blk) & 0xffffu) << "low half of word " << j;
      EXPECT_EQ(p[round_len + 2 * j + 1], word(j, blk) >> 16) << "high half of word " << j;
    }
  }
  std::vector<float> back(src.size(), -7.0f);
  b->unpack_bf16(packed.data(), blocks, block_len, round_len, back.data());
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t j = 0; j < n_known; ++j) {
      EXPECT_EQ(bits(back[blk * block_len + j]), static_cast<uint32_t>(kKnown[j].second ^ (blk << 15)) << 16)
          << "block " << blk << " value " << j;
    }
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(bits(back[blk * block_len + round_len + j]), word(j, blk));
  }
}

TEST(CpuWireBf16, RoundTripIsTheNearestBf16) {
  auto b = make_backend("cpu");
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int64_t n = 4099;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(g);
  std::vector<uint16_t> packed(static_cast<size_t>(n));
  std::vector<float> back(static_cast<size_t>(n));
  b->pack_bf16(x.data(), 1, n, n, packed.data());
  b->unpack_bf16(packed.data(), 1, n, n, back.data());
  for (int64_t i = 0; i < n; ++i) {
    // The nearest of the two bf16 neighbours (truncated and truncated + 1 ulp), the even on a tie.
    const uint32_t lo = bits(x[i]) & 0xffff0000u, hi = lo + 0x10000u;
    const double dlo = std::fabs(static_cast<double>(x[i]) - from_bits(lo));
    const double dhi = std::fabs(static_cast<double>(from_bits(hi)) - x[i]);
    const uint32_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1u) == 0 ? lo : hi;
    ASSERT_EQ(bits(back[i]), want) << "value " << i << " = " << x[i];
  }
}

TEST(CpuWireBf16, EmptyBlocksAndAllWholeWords) {
  auto b = make_backend("cpu");
  // No rounded part: the words travel as they are (a block of meta only).
  const std::vector<int32_t> meta = {-1, 0, 7, INT32_MIN, INT32_MAX};
  const int64_t len = static_cast<int64_t>(meta.size());
  std::vector<uint16_t> packed(static_cast<size_t>(2 * len));
  std::vector<int32_t> back(meta.size(), 3);
  b->pack_bf16(reinterpret_cast<const float*>(meta.data()), 1, len, 0, packed.data());
  b->unpack_bf16(packed.data(), 1, len, 0, reinterpret_cast<float*>(back.data()));
  EXPECT_EQ(back, meta);
  // Nothing at all: nothing written.
  uint16_t untouched = 0xbeef;
  b->pack_bf16(nullptr, 0, 4, 4, &untouched);
  EXPECT_EQ(untouched, 0xbeef);
}

}  // namespace
