// Rows on an fp8 wire (kernels/cpu/wire_fp8.h) through the CPU backend's pack_fp8 / unpack_fp8:
// each 128-value group's scale is its largest magnitude over 448, its codes are torch's
// float8_e4m3fn of the values over the scale (known codes: nearest even, subnormals, ties), a row
// is laid out scales first then codes then zero padding, the whole words come back bit for bit,
// and the codes and scales are those the W8A8 GEMMs' activation quantisation gives the same rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "common/float_bits.h"
#include "compute/backend.h"
#include "fp8_bits.h"
#include "cpu/fp8_act_quant.h"
#include "cpu/fp8_narrow.h"
#include "cpu/threads.h"
#include "cpu/wire_bf16.h"
#include "cpu/wire_fp8.h"

using namespace shardlm;

namespace {

using test::bits;
using test::from_bits;

// Values whose e4m3fn code is known without the code under test (torch.float8_e4m3fn), at scale 1
// (448 is in the group): (value, code, the code's value).
struct Known {
  float x;
  uint8_t code;
  float back;
};
const Known kKnown[] = {
    {448.0f, 0x7e, 448.0f},  // the largest finite code
    {1.0f, 0x38, 1.0f},
    {2.0f, 0x40, 2.0f},
    {0.5f, 0x30, 0.5f},
    {-1.5f, 0xbc, -1.5f},
    {0.0625f, 0x18, 0.0625f},                             // 2^-4
    {std::ldexp(1.0f, -9), 0x01, std::ldexp(1.0f, -9)},   // the smallest subnormal
    {std::ldexp(1.0f, -10), 0x00, 0.0f},                  // half of it: a tie, to the even zero
    {std::ldexp(3.0f, -10), 0x02, std::ldexp(1.0f, -8)},  // 1.5 subnormal steps: a tie, to the even 2
    {17.0f, 0x58, 16.0f},                                 // between 16 and 18: a tie, to the even 16
    {19.0f, 0x5a, 20.0f},                                 // between 18 and 20: a tie, to the even 20
    {-0.0f, 0x80, -0.0f},
    {0.0f, 0x00, 0.0f},
};

float scale_at(const uint8_t* row, int64_t g) {
  float s;
  std::memcpy(&s, row + 4 * g, sizeof s);
  return s;
}

TEST(CpuWireFp8, KnownCodesScalesAndLayout) {
  auto b = make_backend("cpu");
  const int64_t n_known = static_cast<int64_t>(std::size(kKnown));
  // Rows of 141 values: a whole group and a partial one of 13. Row 0: the known values in each
  // group, the second group at 2^-5 of them (scale 2^-5); row 1 all zeros (scale 1, zero codes).
  // Then 3 whole words.
  const int64_t row_len = 141, rows = 2, round_len = rows * row_len, block_len = round_len + 3, blocks = 2;
  ASSERT_EQ(cpu::wire_fp8_groups(row_len), 2);
  ASSERT_EQ(cpu::wire_fp8_row_bytes(row_len), 2 * 4 + 144);
  const int64_t wire = cpu::wire_fp8_bytes(block_len, round_len, row_len);
  ASSERT_EQ(wire, rows * 152 + 3 * 4);
  const uint32_t whole[] = {0xffffffffu, 0x12345678u, 0x7fa00001u};
  const auto word = [&](int64_t j, int64_t blk) {
    return static_cast<uint32_t>(whole[j] + static_cast<uint32_t>(blk));
  };
  std::vector<float> src(static_cast<size_t>(blocks * block_len), 0.0f);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float* row0 = src.data() + blk * block_len;
    const float sign = blk == 0 ? 1.0f : -1.0f;
    for (int64_t j = 0; j < n_known; ++j) {
      row0[j] = sign * kKnown[j].x;
      row0[128 + j] = sign * std::ldexp(kKnown[j].x, -5);
    }
    for (int64_t j = 0; j < 3; ++j) src[blk * block_len + round_len + j] = from_bits(word(j, blk));
  }
  std::vector<uint8_t> packed(static_cast<size_t>(blocks * wire), 0xcd);
  b->pack_fp8(src.data(), blocks, block_len, round_len, row_len, packed.data());
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t flip = blk == 0 ? 0x00 : 0x80;
    const uint8_t* row0 = packed.data() + blk * wire;
    EXPECT_EQ(scale_at(row0, 0), 1.0f);
    EXPECT_EQ(scale_at(row0, 1), std::ldexp(1.0f, -5));
    const uint8_t* codes = row0 + 8;
    for (int64_t j = 0; j < n_known; ++j) {
      EXPECT_EQ(codes[j], kKnown[j].code ^ flip) << "block " << blk << " value " << j;
      EXPECT_EQ(codes[128 + j], kKnown[j].code ^ flip) << "block " << blk << " scaled value " << j;
    }
    for (int64_t j = n_known; j < 128; ++j) EXPECT_EQ(codes[j], 0) << j;
    for (int64_t j = 141; j < 144; ++j) EXPECT_EQ(codes[j], 0) << "padding byte " << j;
    const uint8_t* row1 = row0 + 152;
    EXPECT_EQ(scale_at(row1, 0), 1.0f);
    EXPECT_EQ(scale_at(row1, 1), 1.0f);
    for (int64_t j = 0; j < 144; ++j) EXPECT_EQ(row1[8 + j], 0) << "zero row, byte " << j;
    for (int64_t j = 0; j < 3; ++j) {
      uint32_t w;
      std::memcpy(&w, row0 + rows * 152 + 4 * j, sizeof w);
      EXPECT_EQ(w, word(j, blk)) << "whole word " << j;
    }
  }
  std::vector<float> back(src.size(), -7.0f);
  b->unpack_fp8(packed.data(), blocks, block_len, round_len, row_len, back.data());
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float sign = blk == 0 ? 1.0f : -1.0f;
    const float* row0 = back.data() + blk * block_len;
    for (int64_t j = 0; j < n_known; ++j) {
      EXPECT_EQ(bits(row0[j]), bits(sign * kKnown[j].back)) << "block " << blk << " value " << j;
      EXPECT_EQ(bits(row0[128 + j]), bits(sign * std::ldexp(kKnown[j].back, -5))) << "scaled value " << j;
    }
    for (int64_t j = row_len; j < round_len; ++j) EXPECT_EQ(bits(row0[j]), 0u) << "zero row, value " << j;
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(bits(back[blk * block_len + round_len + j]), word(j, blk));
  }
}

TEST(CpuWireFp8, CodesAndScalesAreTheActivationQuantisation) {
  auto b = make_backend("cpu");
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t row_len : {int64_t{1}, int64_t{5}, int64_t{128}, int64_t{300}, int64_t{7168}}) {
    const int64_t rows = 7, n = rows * row_len, groups = cpu::wire_fp8_groups(row_len);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(g) * std::exp(nd(g));  // magnitudes over many binades
    std::vector<uint8_t> q(static_cast<size_t>(n));
    std::vector<float> scales(static_cast<size_t>(groups * rows));
    cpu::fp8_act_quant(x.data(), rows, row_len, q.data(), scales.data(), rows);
    std::vector<uint8_t> packed(static_cast<size_t>(cpu::wire_fp8_bytes(n, n, row_len)));
    b->pack_fp8(x.data(), 1, n, n, row_len, packed.data());
    std::vector<float> back(static_cast<size_t>(n));
    b->unpack_fp8(packed.data(), 1, n, n, row_len, back.data());
    const int64_t row_bytes = cpu::wire_fp8_row_bytes(row_len);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = packed.data() + r * row_bytes;
      for (int64_t gi = 0; gi < groups; ++gi)
        ASSERT_EQ(bits(scale_at(row, gi)), bits(scales[gi * rows + r])) << "row_len " << row_len << " row " << r;
      for (int64_t k = 0; k < row_len; ++k) {
        const int64_t i = r * row_len + k;
        ASSERT_EQ(row[4 * groups + k], q[i]) << "row_len " << row_len << " row " << r << " value " << k;
        // Within half a step of e4m3 at the value's binade, or of its subnormal step.
        const float s = scales[k / 128 * rows + r];
        ASSERT_LE(std::fabs(back[i] - x[i]), (std::fabs(x[i]) / 16 + s * std::ldexp(1.0f, -10)) * 1.0001f)
            << "row_len " << row_len << " value " << i;
      }
    }
  }
}

// The vector narrowing the CPU pack runs (kernels/cpu/fp8_narrow.h) against the scalar
// fp8_bits::from_f32, lane for lane: every bit pattern of the binades around e4m3's range (2^-16 ..
// 2^13: subnormals, ties, the saturation edge at 464) at a stride of 5, both signs, and a stride of
// 97 over all 2^32 patterns (NaNs, infinities, fp32 subnormals).
TEST(CpuWireFp8, VectorNarrowingIsFromF32) {
  std::vector<uint32_t> patterns;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint64_t u = uint64_t{127 - 16} << 23; u < uint64_t{127 + 14} << 23; u += 5)
      patterns.push_back(sign | static_cast<uint32_t>(u));
  for (uint64_t u = 0; u <= 0xffffffffu; u += 97) patterns.push_back(static_cast<uint32_t>(u));
  while (patterns.size() % 16) patterns.push_back(0x7f800000u);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < patterns.size(); i += 16) {
    cpu::detail::v16f v;
    std::memcpy(&v, &patterns[i], sizeof v);
    const cpu::detail::v16b q = cpu::detail::narrow16_e4m3(v);
    for (int l = 0; l < 16; ++l) {
      if (q[l] != fp8_bits::from_f32(from_bits(patterns[i + l])) && wrong++ == 0) first = i + l;
    }
  }
  EXPECT_EQ(wrong, 0u) << "first at bits 0x" << std::hex << patterns[first] << " of " << std::dec << patterns.size();
}

// The rows spread over the kernels' threads give the one thread's bytes and floats, for the two
// wires (bf16: chunks of a long block; fp8: rows), blocks with whole words included.
TEST(CpuWire, ThreadsGiveOneThreadsBits) {
  auto b = make_backend("cpu");
  const int before = cpu::num_threads();
  const int64_t blocks = 3, row_len = 7168, round_len = 9 * row_len, block_len = round_len + 300;
  std::mt19937 g(17);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(blocks * block_len));
  for (auto& v : x) v = nd(g);
  const auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    std::vector<uint16_t> p16(static_cast<size_t>(blocks * cpu::wire_bf16_len(block_len, round_len)));
    std::vector<uint8_t> p8(static_cast<size_t>(blocks * cpu::wire_fp8_bytes(block_len, round_len, row_len)));
    std::vector<float> back16(x.size()), back8(x.size());
    b->pack_bf16(x.data(), blocks, block_len, round_len, p16.data());
    b->unpack_bf16(p16.data(), blocks, block_len, round_len, back16.data());
    b->pack_fp8(x.data(), blocks, block_len, round_len, row_len, p8.data());
    b->unpack_fp8(p8.data(), blocks, block_len, round_len, row_len, back8.data());
    std::vector<uint32_t> bits_back(2 * x.size());
    std::memcpy(bits_back.data(), back16.data(), x.size() * 4);
    std::memcpy(bits_back.data() + x.size(), back8.data(), x.size() * 4);
    return std::make_tuple(p16, p8, bits_back);
  };
  const auto one = run(1), four = run(4);
  cpu::set_num_threads(before);
  EXPECT_TRUE(std::get<0>(one) == std::get<0>(four)) << "bf16 wire";
  EXPECT_TRUE(std::get<1>(one) == std::get<1>(four)) << "fp8 wire";
  EXPECT_TRUE(std::get<2>(one) == std::get<2>(four)) << "read back";
}

// A NaN, quiet or signalling, stays a NaN code and is no magnitude: the group's scale comes from
// the other values, as on the GPU (whose fmaxf skips both kinds).
TEST(CpuWireFp8, NaNsAreSkippedByTheScale) {
  auto b = make_backend("cpu");
  const std::vector<float> x = {from_bits(0x7fa00000u), 224.0f, from_bits(0xffc00000u), -1.0f};
  std::vector<uint8_t> packed(static_cast<size_t>(cpu::wire_fp8_bytes(4, 4, 4)));
  b->pack_fp8(x.data(), 1, 4, 4, 4, packed.data());
  EXPECT_EQ(scale_at(packed.data(), 0), 0.5f);
  EXPECT_EQ(packed[4], 0x7f);
  EXPECT_EQ(packed[5], 0x7e);
  EXPECT_EQ(packed[6], 0xff);
  EXPECT_EQ(packed[7], 0xc0);  // -1 / 0.5 = -2
}

TEST(CpuWireFp8, AllWholeWordsAndNothing) {
  auto b = make_backend("cpu");
  const std::vector<int32_t> meta = {-1, 0, 7, INT32_MIN, INT32_MAX};
  const int64_t len = static_cast<int64_t>(meta.size());
  std::vector<uint8_t> packed(static_cast<size_t>(cpu::wire_fp8_bytes(len, 0, 64)));
  ASSERT_EQ(packed.size(), 4 * meta.size());
  std::vector<int32_t> back(meta.size(), 3);
  b->pack_fp8(reinterpret_cast<const float*>(meta.data()), 1, len, 0, 64, packed.data());
  b->unpack_fp8(packed.data(), 1, len, 0, 64, reinterpret_cast<float*>(back.data()));
  EXPECT_EQ(back, meta);
  uint8_t untouched = 0xbe;
  b->pack_fp8(nullptr, 0, 4, 4, 4, &untouched);
  EXPECT_EQ(untouched, 0xbe);
}

}  // namespace
