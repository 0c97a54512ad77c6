// CudaBackend against CpuBackend on the expert-parallel row movement, bit for bit: rows gathered
// and combined by index, packed for a bf16 or fp8 wire by block and read back, and gathered
// straight onto the wire and off it (with the combines that read bf16 rows). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "backend_ops_fixture.h"
#include "common/backend_data.h"
#include "compute/backend.h"
#include "core/dtype.h"
#include "cpu/wire_bf16.h"
#include "cpu/wire_fp8.h"

namespace shardlm {
namespace {

using test::down;
using test::randn;
using test::up;

// Twin words that are not the rounding of their fp32 value (NaNs round alike on both backends, but
// a NaN's payload may differ between them, so any NaN twin of a NaN value counts as right).
size_t wrong_twins(const std::vector<uint16_t>& twin, const std::vector<float>& f32) {
  size_t wrong = 0;
  for (size_t i = 0; i < twin.size(); ++i) {
    const bool nan = std::isnan(f32[i]) && (twin[i] & 0x7fffu) > 0x7f80u;
    wrong += twin[i] != f32_to_bf16(f32[i]) && !nan;
  }
  return wrong;
}

// Expert-parallel row movement: gather_rows and combine_rows give the CPU backend's bits (the
// combine's products and sums are separately rounded on both), with repeated and unordered row
// indices, zero rows (-1) and kept rows (cpu::kKeepRow), H below, at and above one block's
// threads, tokens with empty ranges, more tokens than one grid pass would cover only with the
// stride loop, and zero sizes. A gather with a twin writes each row's twin as it moves it, and a
// kept row keeps its twin too.
TEST_F(CudaBackendOps, ExpertRowOpsMatchCpu) {
  std::mt19937 g(21);
  using Case = std::tuple<int64_t, int64_t, int64_t>;  // source rows, H, tokens
  for (auto [R, H, T] : {Case{1, 1, 1}, Case{13, 96, 37}, Case{40, 300, 9}, Case{64, 1024, 5000}}) {
    const auto src = randn(static_cast<size_t>(R * H), 22);
    float* src_g = up(*gpu_, src);
    for (const int64_t n : {int64_t{0}, int64_t{1}, T * 3}) {
      std::vector<int32_t> rows(static_cast<size_t>(n));
      for (auto& r : rows) r = static_cast<int32_t>(g() % (R + 2)) - 2;
      std::vector<float> dst_c(static_cast<size_t>(n * H), -1.0f);
      cpu_.gather_rows(src.data(), H, rows.data(), n, dst_c.data());
      int32_t* rows_g = up(*gpu_, rows);
      float* dst_g = up(*gpu_, std::vector<float>(dst_c.size(), -1.0f));
      gpu_->gather_rows(src_g, H, rows_g, n, dst_g);
      EXPECT_EQ(down(*gpu_, dst_g, dst_c.size()), dst_c) << "gather R " << R << " H " << H << " n " << n;
      // With a twin, over rows already written: a kept row keeps both.
      std::vector<uint16_t> twin_c(dst_c.size(), 0xbeef);
      cpu_.gather_rows(src.data(), H, rows.data(), n, {dst_c.data(), twin_c.data()});
      uint16_t* twin_g = up(*gpu_, std::vector<uint16_t>(twin_c.size(), 0xbeef));
      gpu_->gather_rows(src_g, H, rows_g, n, {dst_g, twin_g});
      const auto tg = down(*gpu_, twin_g, twin_c.size());
      EXPECT_EQ(down(*gpu_, dst_g, dst_c.size()), dst_c) << "gather with a twin R " << R << " H " << H;
      EXPECT_EQ(tg, twin_c) << "twin R " << R << " H " << H << " n " << n;
      size_t kept = 0, wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const std::vector<uint16_t> t(tg.begin() + i * H, tg.begin() + (i + 1) * H);
        if (rows[i] == cpu::kKeepRow) {
          kept += t == std::vector<uint16_t>(static_cast<size_t>(H), 0xbeef);
          continue;
        }
        wrong += wrong_twins(t, std::vector<float>(dst_c.begin() + i * H, dst_c.begin() + (i + 1) * H));
      }
      EXPECT_EQ(wrong, 0u) << "R " << R << " H " << H << " n " << n;
      EXPECT_EQ(kept, static_cast<size_t>(std::count(rows.begin(), rows.end(), cpu::kKeepRow)));
    }
    // Ranges of 0..5 entries per token (a third of the tokens empty or nearly so).
    std::vector<int32_t> start(static_cast<size_t>(T + 1), 0);
    for (int64_t t = 0; t < T; ++t) start[t + 1] = start[t] + static_cast<int32_t>(g() % 6);
    std::vector<int32_t> rows(static_cast<size_t>(start[T]));
    for (auto& r : rows) r = static_cast<int32_t>(g() % R);
    const auto w = randn(rows.size(), 23);
    std::vector<float> out_c(static_cast<size_t>(T * H), 7.0f);
    cpu_.combine_rows(src.data(), H, start.data(), rows.data(), w.data(), T, out_c.data());
    float* out_g = up(*gpu_, std::vector<float>(out_c.size(), 7.0f));
    gpu_->combine_rows(src_g, H, up(*gpu_, start), up(*gpu_, rows), up(*gpu_, w), T, out_g);
    gpu_->synchronize();
    const auto og = down(*gpu_, out_g, out_c.size());
    size_t differ = 0;
    for (size_t i = 0; i < og.size(); ++i) differ += std::memcmp(&og[i], &out_c[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "combine R " << R << " H " << H << " T " << T;
    // No token: out untouched.
    gpu_->combine_rows(src_g, H, up(*gpu_, start), up(*gpu_, rows), up(*gpu_, w), 0, out_g);
    EXPECT_EQ(down(*gpu_, out_g, out_c.size()), og);
  }
}

// Rows packed for a bf16 wire and widened back (kernels/cuda/wire_bf16.h): the CPU's bits both
// ways, with NaNs, infinities and ties planted in the rounded part and arbitrary words in the
// whole part, over one block, a block longer than one pass of the grid (x stride), and more blocks
// than the grid's y dimension holds (y stride).
TEST_F(CudaBackendOps, WireBf16MatchesCpu) {
  using Case = std::tuple<int64_t, int64_t, int64_t>;  // blocks, block_len, round_len
  for (auto [blocks, len, round] :
       {Case{1, 1, 1}, Case{1, 5, 0}, Case{3, 1000, 700}, Case{2, 300001, 299990}, Case{66000, 3, 2}}) {
    auto src = randn(static_cast<size_t>(blocks * len), static_cast<uint32_t>(40 + len));
    const uint32_t planted[] = {0x7fa00000u, 0xff800000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xffffffffu};
    for (size_t i = 0; i < src.size(); i += 7) std::memcpy(&src[i], &planted[(i / 7) % 6], sizeof(float));
    const int64_t wire = cpu::wire_bf16_len(len, round);
    std::vector<uint16_t> packed_c(static_cast<size_t>(blocks * wire));
    cpu_.pack_bf16(src.data(), blocks, len, round, packed_c.data());
    uint16_t* packed_g = up(*gpu_, std::vector<uint16_t>(packed_c.size(), 0xdead));
    gpu_->pack_bf16(up(*gpu_, src), blocks, len, round, packed_g);
    EXPECT_EQ(down(*gpu_, packed_g, packed_c.size()), packed_c) << blocks << " x " << len << " / " << round;
    std::vector<float> back_c(src.size());
    cpu_.unpack_bf16(packed_c.data(), blocks, len, round, back_c.data());
    float* back_g = up(*gpu_, std::vector<float>(src.size(), -3.0f));
    gpu_->unpack_bf16(packed_g, blocks, len, round, back_g);
    const auto bg = down(*gpu_, back_g, back_c.size());
    EXPECT_EQ(std::memcmp(bg.data(), back_c.data(), bg.size() * sizeof(float)), 0)
        << blocks << " x " << len << " / " << round;
  }
}

// Rows quantised for an fp8 wire and read back (kernels/cuda/wire_fp8.h): the CPU's bytes (scales,
// codes, zero padding, whole words) and the CPU's floats back, with NaNs, infinities, zeros and a
// saturating value planted, over rows of one value, partial groups, more 128-value groups than one
// pass of the grid holds (x stride, with several warps' worth of whole words) and more blocks than
// the grid's y dimension holds (y stride). A NaN's sign is the device's (a NaN out of x / s or
// inf / inf takes the sign the arithmetic gives it, which differs between x86 and a GPU): a NaN code
// matches either NaN code, and a NaN read back any NaN.
TEST_F(CudaBackendOps, WireFp8MatchesCpu) {
  using Case = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // blocks, block_len, round_len, row_len
  for (auto [blocks, len, round, row] : {Case{1, 1, 1, 1}, Case{1, 5, 0, 3}, Case{3, 1000, 700, 140},
                                         Case{1, 9000 * 128 + 300, 9000 * 128, 128}, Case{66000, 3, 2, 1}}) {
    auto src = randn(static_cast<size_t>(blocks * len), static_cast<uint32_t>(50 + len));
    const uint32_t planted[] = {0x7fa00000u, 0xff800000u, 0x80000000u, 0x00000000u, 0x43e40000u, 0xffffffffu};
    for (size_t i = 0; i < src.size(); i += 37) std::memcpy(&src[i], &planted[(i / 37) % 6], sizeof(float));
    const int64_t wire = cpu::wire_fp8_bytes(len, round, row);
    std::vector<uint8_t> packed_c(static_cast<size_t>(blocks * wire));
    cpu_.pack_fp8(src.data(), blocks, len, round, row, packed_c.data());
    uint8_t* packed_g = up(*gpu_, std::vector<uint8_t>(packed_c.size(), 0xcd));
    gpu_->pack_fp8(up(*gpu_, src), blocks, len, round, row, packed_g);
    const auto pg = down(*gpu_, packed_g, packed_c.size());
    const int64_t groups = cpu::wire_fp8_groups(row), row_bytes = cpu::wire_fp8_row_bytes(row);
    const auto is_code = [&](size_t i) {
      const int64_t at = static_cast<int64_t>(i) % wire, r = at / row_bytes, in_row = at % row_bytes;
      return r < round / row && in_row >= 4 * groups && in_row < 4 * groups + row;
    };
    const auto nan_code = [](uint8_t c) { return (c & 0x7f) == 0x7f; };
    size_t first = pg.size();
    for (size_t i = 0; i < pg.size() && first == pg.size(); ++i)
      if (pg[i] != packed_c[i] && !(is_code(i) && nan_code(pg[i]) && nan_code(packed_c[i]))) first = i;
    EXPECT_EQ(first, pg.size()) << blocks << " x " << len << " / " << round << ": byte " << first << " differs";
    std::vector<float> back_c(src.size());
    cpu_.unpack_fp8(packed_c.data(), blocks, len, round, row, back_c.data());
    float* back_g = up(*gpu_, std::vector<float>(src.size(), -3.0f));
    gpu_->unpack_fp8(packed_g, blocks, len, round, row, back_g);
    const auto bg = down(*gpu_, back_g, back_c.size());
    size_t differ = 0;
    for (size_t i = 0; i < bg.size(); ++i)
      differ += std::memcmp(&bg[i], &back_c[i], sizeof(float)) != 0 && !(std::isnan(bg[i]) && std::isnan(back_c[i]));
    EXPECT_EQ(differ, 0u) << blocks << " x " << len << " / " << round;
  }
}

// Rows gathered onto a wire and off it in one pass (pack_rows / unpack_rows, bf16 and fp8) and
// the two combines (combine_rows, expert_combine) read off bf16 rows: the CPU's bits, with NaNs,
// infinities and saturating values planted, repeated and -1 rows, partial 128-value groups, rows
// of one value and of 7168, and 70000 rows. NaN signs as in WireFp8MatchesCpu.
TEST_F(CudaBackendOps, WireRowsMatchCpu) {
  std::mt19937 g(31);
  using Case = std::tuple<int64_t, int64_t, int64_t>;  // source rows, H, rows moved
  for (auto [R, H, n] :
       {Case{1, 1, 1}, Case{9, 130, 40}, Case{40, 300, 200}, Case{64, 7168, 48}, Case{3000, 128, 70000}}) {
    auto src = randn(static_cast<size_t>(R * H), static_cast<uint32_t>(60 + H));
    const uint32_t planted[] = {0x7fa00000u, 0xff800000u, 0x3f808000u, 0x43e40000u, 0x80000000u, 0xffffffffu};
    for (size_t i = 0; i < src.size(); i += 31) std::memcpy(&src[i], &planted[(i / 31) % 6], sizeof(float));
    std::vector<int32_t> rows(static_cast<size_t>(n));
    for (auto& r : rows) r = static_cast<int32_t>(g() % (R + 1)) - 1;
    const float* src_g = up(*gpu_, src);
    const int32_t* rows_g = up(*gpu_, rows);
    const auto same_floats = [](const std::vector<float>& a, const std::vector<float>& b) {
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i)
        differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]));
      return differ;
    };
    // bf16: onto the wire, and back through the reversed index.
    std::vector<uint16_t> p16_c(static_cast<size_t>(n * H));
    cpu_.pack_rows_bf16(src.data(), H, rows.data(), n, p16_c.data());
    uint16_t* p16_g = up(*gpu_, std::vector<uint16_t>(p16_c.size(), 0xdead));
    gpu_->pack_rows_bf16(src_g, H, rows_g, n, p16_g);
    EXPECT_EQ(down(*gpu_, p16_g, p16_c.size()), p16_c) << "bf16 rows " << R << " x " << H << ", " << n;
    std::vector<int32_t> back(rows.size());
    for (int64_t i = 0; i < n; ++i) back[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(n - 1 - i);
    const int32_t* back_g = up(*gpu_, back);
    std::vector<float> b16_c(static_cast<size_t>(n * H));
    cpu_.unpack_rows_bf16(p16_c.data(), H, back.data(), n, b16_c.data());
    float* b16_g = up(*gpu_, std::vector<float>(b16_c.size(), -3.0f));
    gpu_->unpack_rows_bf16(p16_g, H, back_g, n, b16_g);
    EXPECT_EQ(same_floats(down(*gpu_, b16_g, b16_c.size()), b16_c), 0u) << "bf16 back " << R << " x " << H;
    // With the twin, in the same pass: the wire's own words (zeros for -1 rows), NaNs aside.
    uint16_t* t16_g = up(*gpu_, std::vector<uint16_t>(b16_c.size(), 0xbeef));
    gpu_->unpack_rows_bf16(p16_g, H, back_g, n, {b16_g, t16_g});
    const auto t16 = down(*gpu_, t16_g, b16_c.size());
    EXPECT_EQ(same_floats(down(*gpu_, b16_g, b16_c.size()), b16_c), 0u) << "bf16 back, twin " << R << " x " << H;
    EXPECT_EQ(wrong_twins(t16, b16_c), 0u) << "bf16 twin " << R << " x " << H;
    size_t off_wire = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < H; ++c) {
        const uint16_t want = back[i] < 0 ? uint16_t{0} : p16_c[back[i] * H + c];
        off_wire += t16[i * H + c] != want && !std::isnan(b16_c[i * H + c]);
      }
    EXPECT_EQ(off_wire, 0u) << "bf16 twin " << R << " x " << H << ": not the wire's words";
    // fp8 likewise.
    const int64_t row_bytes = cpu::wire_fp8_row_bytes(H), groups = cpu::wire_fp8_groups(H);
    std::vector<uint8_t> p8_c(static_cast<size_t>(n * row_bytes));
    cpu_.pack_rows_fp8(src.data(), H, rows.data(), n, p8_c.data());
    uint8_t* p8_g = up(*gpu_, std::vector<uint8_t>(p8_c.size(), 0xcd));
    gpu_->pack_rows_fp8(src_g, H, rows_g, n, p8_g);
    const auto p8 = down(*gpu_, p8_g, p8_c.size());
    const auto nan_code = [](uint8_t c) { return (c & 0x7f) == 0x7f; };
    size_t first = p8.size();
    for (size_t i = 0; i < p8.size() && first == p8.size(); ++i) {
      const int64_t in_row = static_cast<int64_t>(i) % row_bytes;
      const bool code = in_row >= 4 * groups && in_row < 4 * groups + H;
      if (p8[i] != p8_c[i] && !(code && nan_code(p8[i]) && nan_code(p8_c[i]))) first = i;
    }
    EXPECT_EQ(first, p8.size()) << "fp8 rows " << R << " x " << H << ": byte " << first << " differs";
    std::vector<float> b8_c(static_cast<size_t>(n * H));
    cpu_.unpack_rows_fp8(p8_c.data(), H, back.data(), n, b8_c.data());
    float* b8_g = up(*gpu_, std::vector<float>(b8_c.size(), -3.0f));
    gpu_->unpack_rows_fp8(p8_g, H, back_g, n, b8_g);
    EXPECT_EQ(same_floats(down(*gpu_, b8_g, b8_c.size()), b8_c), 0u) << "fp8 back " << R << " x " << H;
    uint16_t* t8_g = up(*gpu_, std::vector<uint16_t>(b8_c.size(), 0xbeef));
    gpu_->unpack_rows_fp8(p8_g, H, back_g, n, {b8_g, t8_g});
    EXPECT_EQ(same_floats(down(*gpu_, b8_g, b8_c.size()), b8_c), 0u) << "fp8 back, twin " << R << " x " << H;
    EXPECT_EQ(wrong_twins(down(*gpu_, t8_g, b8_c.size()), b8_c), 0u) << "fp8 twin " << R << " x " << H;
    // The combine read off the bf16 rows: tokens of 0..5 of them.
    const int64_t T = n / 3 + 1;
    std::vector<int32_t> start(static_cast<size_t>(T + 1), 0);
    for (int64_t t = 0; t < T; ++t) start[t + 1] = start[t] + static_cast<int32_t>(g() % 6);
    std::vector<int32_t> pick(static_cast<size_t>(start[T]));
    for (auto& r : pick) r = static_cast<int32_t>(g() % std::max<int64_t>(n, 1));
    const auto w = randn(pick.size(), 61);
    std::vector<float> out_c(static_cast<size_t>(T * H));
    cpu_.combine_rows_bf16(p16_c.data(), H, start.data(), pick.data(), w.data(), T, out_c.data());
    float* out_g = up(*gpu_, std::vector<float>(out_c.size(), 7.0f));
    gpu_->combine_rows_bf16(p16_g, H, up(*gpu_, start), up(*gpu_, pick), up(*gpu_, w), T, out_g);
    EXPECT_EQ(same_floats(down(*gpu_, out_g, out_c.size()), out_c), 0u) << "bf16 combine " << R << " x " << H;
    // A captured combine's sum off the bf16 rows: top-6 slots, some off this rank (-1).
    const int64_t k = 6;
    std::vector<int32_t> ids(static_cast<size_t>(T * k)), slot_row(ids.size());
    for (auto& e : ids) e = static_cast<int32_t>(g() % 8);
    for (auto& r : slot_row) r = static_cast<int32_t>(g() % (n + 1)) - 1;
    const auto wk = randn(ids.size(), 62);
    std::vector<float> ec_c(static_cast<size_t>(T * H));
    cpu_.expert_combine_bf16(p16_c.data(), H, ids.data(), wk.data(), slot_row.data(), T, k, ec_c.data());
    float* ec_g = up(*gpu_, std::vector<float>(ec_c.size(), 7.0f));
    gpu_->expert_combine_bf16(p16_g, H, up(*gpu_, ids), up(*gpu_, wk), up(*gpu_, slot_row), T, k, ec_g);
    EXPECT_EQ(same_floats(down(*gpu_, ec_g, ec_c.size()), ec_c), 0u) << "bf16 expert combine " << R << " x " << H;
  }
}

}  // namespace
}  // namespace shardlm
