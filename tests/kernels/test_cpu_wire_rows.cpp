// Rows gathered onto a wire and off it in one pass (kernels/cpu/wire_bf16.h, wire_fp8.h
// pack_rows / unpack_rows; expert_rows.h combine_rows_bf16; expert_permute.h
// expert_combine_bf16), through the CPU backend: each gives the bits of the two passes it replaces
// (gather_rows, then the block pack; the block unpack, then gather_rows; the block unpack, then
// combine_rows or expert_combine), with repeated rows, rows past the first pass
// of the threads, and -1 rows (a zero row on the wire, zeros off it). The vector bf16 narrowing the
// packs use is bf16_bits::from_f32 over many bit patterns.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "bf16_bits.h"
#include "common/float_bits.h"
#include "compute/backend.h"
#include "cpu/bf16_narrow.h"
#include "cpu/threads.h"
#include "cpu/wire_bf16.h"
#include "cpu/wire_fp8.h"

using namespace shardlm;

namespace {

using test::from_bits;

// R source rows of H values (normal, with NaNs, infinities, ties and saturating values planted)
// and n row indices into them, some repeated and some -1.
struct Rows {
  int64_t R, H, n;
  std::vector<float> src;
  std::vector<int32_t> index;
  Rows(int64_t r, int64_t h, int64_t count, uint32_t seed) : R(r), H(h), n(count) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    src.resize(static_cast<size_t>(R * H));
    for (auto& v : src) v = nd(g);
    const uint32_t planted[] = {0x7fa00000u, 0xff800000u, 0x3f808000u, 0x43e40000u, 0x80000000u, 0xffc00001u};
    for (size_t i = 0; i < src.size(); i += 29) src[i] = from_bits(planted[(i / 29) % 6]);
    index.resize(static_cast<size_t>(n));
    for (auto& i : index) i = static_cast<int32_t>(g() % (R + 1)) - 1;
  }
};

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

using Case = std::tuple<int64_t, int64_t, int64_t>;  // source rows, H, rows moved
const Case kCases[] = {{1, 1, 1}, {5, 3, 0}, {9, 130, 40}, {40, 300, 200}, {64, 7168, 48}};

TEST(CpuWireRows, Bf16RowsAreGatherThenPack) {
  auto b = make_backend("cpu");
  for (auto [R, H, n] : kCases) {
    const Rows rows(R, H, n, static_cast<uint32_t>(R + H));
    std::vector<float> gathered(static_cast<size_t>(n * H));
    b->gather_rows(rows.src.data(), H, rows.index.data(), n, gathered.data());
    std::vector<uint16_t> want(gathered.size()), got(gathered.size(), 0xdead);
    b->pack_bf16(gathered.data(), 1, n * H, n * H, want.data());
    b->pack_rows_bf16(rows.src.data(), H, rows.index.data(), n, got.data());
    EXPECT_EQ(got, want) << R << " x " << H << ", " << n << " rows";
    // Off the wire: the wire rows (as source rows) read back through a second index.
    const Rows back(n > 0 ? n : 1, H, 2 * n + 1, static_cast<uint32_t>(7 * H));
    std::vector<float> widened(got.size()), gather_after(static_cast<size_t>(back.n * H)),
        fused(gather_after.size(), -5.0f);
    b->unpack_bf16(got.data(), 1, n * H, n * H, widened.data());
    if (n > 0) {
      b->gather_rows(widened.data(), H, back.index.data(), back.n, gather_after.data());
      b->unpack_rows_bf16(got.data(), H, back.index.data(), back.n, fused.data());
      EXPECT_EQ(bits_of(fused), bits_of(gather_after)) << R << " x " << H << ", " << n << " rows back";
    }
  }
}

TEST(CpuWireRows, Fp8RowsAreGatherThenPack) {
  auto b = make_backend("cpu");
  for (auto [R, H, n] : kCases) {
    const Rows rows(R, H, n, static_cast<uint32_t>(3 * R + H));
    std::vector<float> gathered(static_cast<size_t>(n * H));
    b->gather_rows(rows.src.data(), H, rows.index.data(), n, gathered.data());
    const auto bytes = static_cast<size_t>(n * cpu::wire_fp8_row_bytes(H));
    std::vector<uint8_t> want(bytes), got(bytes, 0xcd);
    b->pack_fp8(gathered.data(), 1, n * H, n * H, H, want.data());
    b->pack_rows_fp8(rows.src.data(), H, rows.index.data(), n, got.data());
    EXPECT_EQ(got, want) << R << " x " << H << ", " << n << " rows";
    const Rows back(n > 0 ? n : 1, H, 2 * n + 1, static_cast<uint32_t>(11 * H));
    std::vector<float> read(static_cast<size_t>(n * H)), gather_after(static_cast<size_t>(back.n * H)),
        fused(gather_after.size(), -5.0f);
    b->unpack_fp8(got.data(), 1, n * H, n * H, H, read.data());
    if (n > 0) {
      b->gather_rows(read.data(), H, back.index.data(), back.n, gather_after.data());
      b->unpack_rows_fp8(got.data(), H, back.index.data(), back.n, fused.data());
      EXPECT_EQ(bits_of(fused), bits_of(gather_after)) << R << " x " << H << ", " << n << " rows back";
    }
  }
}

// The combine's sum read straight off bf16 rows: combine_rows' bits on the widened rows.
TEST(CpuWireRows, Bf16CombineIsWidenThenCombine) {
  auto b = make_backend("cpu");
  std::mt19937 g(5);
  for (auto [R, H, T] : {Case{1, 1, 1}, Case{13, 96, 37}, Case{64, 1024, 300}}) {
    const Rows rows(R, H, 0, static_cast<uint32_t>(R * H));
    std::vector<uint16_t> y(rows.src.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_bits::from_f32(rows.src[i]);
    std::vector<float> widened(y.size());
    for (size_t i = 0; i < y.size(); ++i) widened[i] = bf16_bits::to_f32(y[i]);
    std::vector<int32_t> start(static_cast<size_t>(T + 1), 0);
    for (int64_t t = 0; t < T; ++t) start[t + 1] = start[t] + static_cast<int32_t>(g() % 6);
    std::vector<int32_t> index(static_cast<size_t>(start[T]));
    for (auto& r : index) r = static_cast<int32_t>(g() % R);
    std::vector<float> w(index.size());
    for (auto& v : w) v = static_cast<float>(g() % 1000) / 997.0f;
    std::vector<float> want(static_cast<size_t>(T * H), 7.0f), got(want.size(), -7.0f);
    b->combine_rows(widened.data(), H, start.data(), index.data(), w.data(), T, want.data());
    b->combine_rows_bf16(y.data(), H, start.data(), index.data(), w.data(), T, got.data());
    EXPECT_EQ(bits_of(got), bits_of(want)) << R << " x " << H << ", " << T << " tokens";
  }
}

// A captured combine's sum read straight off bf16 rows: expert_combine's bits on the widened rows,
// with slots off this rank (-1) and repeated experts.
TEST(CpuWireRows, Bf16ExpertCombineIsWidenThenCombine) {
  auto b = make_backend("cpu");
  std::mt19937 g(9);
  for (auto [R, H, T] : {Case{1, 1, 1}, Case{13, 96, 37}, Case{64, 1024, 300}}) {
    const int64_t k = 6;
    const Rows rows(R, H, 0, static_cast<uint32_t>(R + 3 * H));
    std::vector<uint16_t> y(rows.src.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_bits::from_f32(rows.src[i]);
    std::vector<float> widened(y.size());
    for (size_t i = 0; i < y.size(); ++i) widened[i] = bf16_bits::to_f32(y[i]);
    std::vector<int32_t> ids(static_cast<size_t>(T * k)), slot_row(ids.size());
    for (auto& e : ids) e = static_cast<int32_t>(g() % 8);
    for (auto& r : slot_row) r = static_cast<int32_t>(g() % (R + 1)) - 1;
    std::vector<float> w(ids.size());
    for (auto& v : w) v = static_cast<float>(g() % 1000) / 997.0f;
    std::vector<float> want(static_cast<size_t>(T * H), 7.0f), got(want.size(), -7.0f);
    b->expert_combine(widened.data(), H, ids.data(), w.data(), slot_row.data(), T, k, want.data());
    b->expert_combine_bf16(y.data(), H, ids.data(), w.data(), slot_row.data(), T, k, got.data());
    EXPECT_EQ(bits_of(got), bits_of(want)) << R << " x " << H << ", " << T << " tokens";
  }
}

TEST(CpuWireRows, ThreadsGiveOneThreadsBits) {
  auto b = make_backend("cpu");
  const int before = cpu::num_threads();
  const Rows rows(50, 7168, 40, 3);
  const auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    std::vector<uint16_t> p16(static_cast<size_t>(rows.n * rows.H));
    std::vector<uint8_t> p8(static_cast<size_t>(rows.n * cpu::wire_fp8_row_bytes(rows.H)));
    std::vector<float> back16(p16.size()), back8(p16.size());
    std::vector<int32_t> all(static_cast<size_t>(rows.n));
    for (int64_t i = 0; i < rows.n; ++i) all[i] = static_cast<int32_t>(rows.n - 1 - i);
    b->pack_rows_bf16(rows.src.data(), rows.H, rows.index.data(), rows.n, p16.data());
    b->pack_rows_fp8(rows.src.data(), rows.H, rows.index.data(), rows.n, p8.data());
    b->unpack_rows_bf16(p16.data(), rows.H, all.data(), rows.n, back16.data());
    b->unpack_rows_fp8(p8.data(), rows.H, all.data(), rows.n, back8.data());
    return std::make_tuple(p16, p8, bits_of(back16), bits_of(back8));
  };
  const auto one = run(1), four = run(4);
  cpu::set_num_threads(before);
  EXPECT_TRUE(one == four);
}

TEST(CpuWireRows, VectorBf16NarrowingIsFromF32) {
  std::vector<uint32_t> patterns;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t low = 0; low < 0x20000u; ++low) patterns.push_back(sign | 0x3f800000u | low);  // ties and rounding
  for (uint64_t u = 0; u <= 0xffffffffu; u += 61) patterns.push_back(static_cast<uint32_t>(u));
  for (uint32_t special : {0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fa00000u, 0xffc00001u, 0x7fffffffu, 1u})
    patterns.push_back(special);
  std::vector<uint16_t> got(patterns.size());
  std::vector<float> x(patterns.size());
  std::memcpy(x.data(), patterns.data(), x.size() * sizeof(float));
  cpu::detail::narrow_bf16(x.data(), static_cast<int64_t>(x.size()), got.data());
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < patterns.size(); ++i)
    if (got[i] != bf16_bits::from_f32(x[i]) && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << "first at bits 0x" << std::hex << patterns[first];
  std::vector<float> back(got.size());
  cpu::detail::widen_bf16(got.data(), static_cast<int64_t>(got.size()), back.data());
  for (size_t i = 0; i < got.size() && wrong == 0; ++i)
    if (test::bits(back[i]) != static_cast<uint32_t>(got[i]) << 16 && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << "widening at " << first;
}

}  // namespace
