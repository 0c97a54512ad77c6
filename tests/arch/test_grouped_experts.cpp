// run_experts through grouped_linear, on the CPU backend: the output must equal, bit for bit, the
// former loop of three linears and a silu_mul per expert, whatever the chunking (one chunk,
// chunks that split the experts with empty experts at and inside a boundary, one expert per
// chunk), for bf16 and fp32 weights, with each expert's gate and up apart or stacked (one weight
// [2 inter, H]: one grouped call and silu_mul_stacked); run_routed_experts the same from device
// offsets; silu_mul_stacked's default against silu_mul. Also ComputeBackend::grouped_linear's
// default (one linear per non-empty group, rows outside the groups untouched) and its argument
// checks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "arch/expert_ffn.h"
#include "arch/scratch.h"
#include "common/backend_data.h"
#include "compute/cpu_backend.h"
#include "cpu/threads.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/checkpoint.h"

namespace shardlm {
namespace {

using test::randn;

class GroupedExperts : public ::testing::Test {
 protected:
  Matrix weight(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
    return cpu_.load_matrix(store_.random(dtype, rows, cols, seed, 0.1f));
  }
  // L experts; stacked: each expert's gate and up one weight [2 inter, H], rows of one load, so
  // that up lies right after gate (LocalExperts::stacked).
  void experts(LocalExperts* out, DType dtype, int64_t L, int64_t H, int64_t inter, bool stacked = false) {
    std::vector<ExpertWeights> ex(static_cast<size_t>(L));
    for (int64_t e = 0; e < L; ++e) {
      const auto s = static_cast<uint32_t>(100 + 3 * e);
      if (stacked) {
        const Matrix both = weight(dtype, 2 * inter, H, s);
        ex[e].gate = ex[e].up = both;
        ex[e].gate.rows = ex[e].up.rows = inter;
        ex[e].up.data = static_cast<const uint8_t*>(both.data) + static_cast<size_t>(inter * H) * dtype_size(dtype);
      } else {
        ex[e].gate = weight(dtype, inter, H, s);
        ex[e].up = weight(dtype, inter, H, s + 1);
      }
      ex[e].down = weight(dtype, H, inter, s + 2);
    }
    out->assign(std::move(ex), &cpu_);  // the CPU moves nothing: stacked as loaded, or not
    ASSERT_EQ(out->stacked(), stacked);
  }
  test::WeightStore store_;
  CpuBackend cpu_;
};

// The former run_experts: per expert, gate and up linears, silu_mul, the down linear.
std::vector<float> per_expert_loop(ComputeBackend& b, const LocalExperts& experts, int64_t H,
                                   const std::vector<float>& in, const std::vector<int64_t>& offsets) {
  const std::vector<ExpertWeights>& ex = experts.weights();
  const int64_t inter = experts.inter();
  std::vector<float> out(in.size(), 0.0f);
  for (size_t e = 0; e < ex.size(); ++e) {
    const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
    if (n == 0) continue;
    std::vector<float> gate(static_cast<size_t>(n * inter)), up(gate.size());
    b.linear(in.data() + r0 * H, n, ex[e].gate, nullptr, gate.data());
    b.linear(in.data() + r0 * H, n, ex[e].up, nullptr, up.data());
    b.silu_mul(gate.data(), up.data(), gate.data(), n * inter);
    b.linear(gate.data(), n, ex[e].down, nullptr, out.data() + r0 * H);
  }
  return out;
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << ": element " << i << " is " << b[i] << ", expected " << a[i];
  }
}

TEST_F(GroupedExperts, RunExpertsMatchesPerExpertLoopBitForBit) {
  const int64_t H = 48, inter = 40;
  // Experts 1 and 4 empty; with 32-row chunks (limit 33, the largest expert) the chunks are
  // experts [0, 2) (ending on the empty expert 1), [2, 3) and [3, 7) (empty expert 4 inside).
  const std::vector<int64_t> rows = {5, 0, 33, 1, 0, 20, 9};
  std::vector<int64_t> offsets{0};
  for (int64_t n : rows) offsets.push_back(offsets.back() + n);
  const int64_t R = offsets.back();
  const std::vector<float> in = randn(static_cast<size_t>(R * H), 7, 1.0f);
  for (DType dt : {DType::BF16, DType::F32}) {
    for (bool stacked : {false, true}) {
      LocalExperts ex;
      experts(&ex, dt, static_cast<int64_t>(rows.size()), H, inter, stacked);
      const std::vector<float> want = per_expert_loop(cpu_, ex, H, in, offsets);
      for (int64_t chunk : {int64_t{-1}, int64_t{16384}, int64_t{32}, int64_t{1}}) {
        Scratch scratch(cpu_);
        std::vector<float> got(in.size(), 0.0f);
        run_experts(scratch, ex, H, in.data(), offsets, got.data(), chunk);
        expect_bits_equal(want, got,
                          std::string(dtype_name(dt)) + (stacked ? ", stacked" : ", apart") + ", chunks of " +
                              std::to_string(chunk) + " rows");
      }
    }
  }
}

// run_routed_experts: the groups' offsets in backend memory (the default reads them back), up to
// P rows of which the groups hold fewer; the routed rows have the per-expert loop's bits, apart
// or stacked, and the rows past them are not written.
TEST_F(GroupedExperts, RoutedExpertsMatchPerExpertLoopBitForBit) {
  const int64_t H = 40, inter = 24, P = 30;
  const std::vector<int32_t> offsets = {0, 3, 3, 11, 12, 26};
  const std::vector<int64_t> offsets64(offsets.begin(), offsets.end());
  const std::vector<float> in = randn(static_cast<size_t>(P * H), 8, 1.0f);
  for (DType dt : {DType::BF16, DType::F32}) {
    for (bool stacked : {false, true}) {
      LocalExperts ex;
      experts(&ex, dt, 5, H, inter, stacked);
      std::vector<float> want = per_expert_loop(cpu_, ex, H, in, offsets64);
      for (size_t i = static_cast<size_t>(offsets.back() * H); i < want.size(); ++i) want[i] = -3.0f;
      Scratch scratch(cpu_);
      std::vector<float> got(in.size(), -3.0f);
      run_routed_experts(scratch, ex, in.data(), P, P, offsets.data(), got.data());
      expect_bits_equal(want, got, std::string(dtype_name(dt)) + (stacked ? ", stacked" : ", apart"));
    }
  }
}

// silu_mul_stacked, the CPU's and the default (silu_mul row by row), gives each element and twin
// silu_mul's bits, over one thread and over several.
TEST_F(GroupedExperts, SiluMulStackedIsSiluMulOnEachRowsHalves) {
  const int threads_before = cpu::num_threads();
  cpu::set_num_threads(2);
  for (const auto& [rows, width] : {std::pair<int64_t, int64_t>{5, 12}, {300, 260}}) {  // 78000: threaded
    const std::vector<float> gate_up = randn(static_cast<size_t>(rows * 2 * width), 11, 3.0f);
    std::vector<float> gate, up;
    test::split_stacked_rows(gate_up, rows, width, &gate, &up);
    const size_t n = static_cast<size_t>(rows * width);
    std::vector<float> want(n), got(n), by_default(n);
    std::vector<uint16_t> want_twin(n), got_twin(n), default_twin(n);
    cpu_.silu_mul(gate.data(), up.data(), {want.data(), want_twin.data()}, static_cast<int64_t>(n));
    cpu_.silu_mul_stacked(gate_up.data(), rows, width, {got.data(), got_twin.data()});
    cpu_.ComputeBackend::silu_mul_stacked(gate_up.data(), rows, width, {by_default.data(), default_twin.data()});
    const std::string what = std::to_string(rows) + " x " + std::to_string(width);
    expect_bits_equal(want, got, "cpu silu_mul_stacked, " + what);
    expect_bits_equal(want, by_default, "default silu_mul_stacked, " + what);
    EXPECT_EQ(want_twin, got_twin) << what;
    EXPECT_EQ(want_twin, default_twin) << what;
  }
  cpu::set_num_threads(threads_before);
}

TEST_F(GroupedExperts, NoRowsWritesNothing) {
  const int64_t H = 16;
  LocalExperts ex;
  experts(&ex, DType::F32, 3, H, 8);
  Scratch scratch(cpu_);
  std::vector<float> out(4, 5.0f);
  run_experts(scratch, ex, H, nullptr, {0, 0, 0, 0}, out.data());
  for (float v : out) EXPECT_EQ(v, 5.0f);
}

// CpuBackend::grouped_linear (all groups in one parallel region, cut into column ranges) and
// ComputeBackend's default (one linear per group) both equal per-group linear() bit for bit: small
// shapes on one thread, and shapes large enough to split over threads with one-row groups (the
// decode tile), an N that is not a multiple of the tile widths, and mixed dtypes (the default).
TEST_F(GroupedExperts, GroupedLinearIsOneLinearPerGroupBitForBit) {
  struct Case {
    int64_t N, K;
    std::vector<int64_t> offsets;  // groups start at offsets[0]: earlier rows of y stay as they were
  };
  const Case cases[] = {{24, 20, {2, 5, 5, 12, 13}},
                        {300, 136, {0, 1, 1, 40, 41, 42, 107, 107, 108}},
                        {1030, 64, {3, 4, 20, 21}}};
  const int threads_before = cpu::num_threads();
  cpu::set_num_threads(2);
  for (const Case& c : cases) {
    const int64_t G = static_cast<int64_t>(c.offsets.size()) - 1, R = c.offsets.back();
    const std::vector<float> x = randn(static_cast<size_t>(R * c.K), 9, 1.0f);
    for (int mode = 0; mode < 3; ++mode) {  // bf16, f32, mixed
      std::vector<Matrix> w;
      for (int64_t g = 0; g < G; ++g) {
        const DType dt = mode == 0 ? DType::BF16 : mode == 1 ? DType::F32 : (g % 2 ? DType::BF16 : DType::F32);
        w.push_back(weight(dt, c.N, c.K, static_cast<uint32_t>(200 + g)));
      }
      std::vector<const Matrix*> wp;
      for (const Matrix& m : w) wp.push_back(&m);
      std::vector<float> want(static_cast<size_t>(R * c.N), -1.0f), got(want), by_default(want);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r0 = c.offsets[g], n = c.offsets[g + 1] - r0;
        if (n > 0) cpu_.linear(x.data() + r0 * c.K, n, w[g], nullptr, want.data() + r0 * c.N);
      }
      cpu_.grouped_linear(x.data(), c.offsets, wp, got.data());
      cpu_.ComputeBackend::grouped_linear(x.data(), c.offsets, wp, by_default.data());
      const std::string what = "N " + std::to_string(c.N) + " mode " + std::to_string(mode);
      expect_bits_equal(want, got, "cpu grouped_linear, " + what);
      expect_bits_equal(want, by_default, "default grouped_linear, " + what);
    }
  }
  cpu::set_num_threads(threads_before);
}

TEST_F(GroupedExperts, GroupedLinearChecksItsArguments) {
  const Matrix a = weight(DType::F32, 8, 4, 300), b = weight(DType::F32, 8, 4, 301), c = weight(DType::F32, 4, 8, 302);
  std::vector<float> x(64), y(64);
  EXPECT_THROW(cpu_.grouped_linear(x.data(), {0, 1}, {&a, &b}, y.data()), Error);          // offsets count
  EXPECT_THROW(cpu_.grouped_linear(x.data(), {0, 3, 2}, {&a, &b}, y.data()), Error);       // decreasing
  EXPECT_THROW(cpu_.grouped_linear(x.data(), {-1, 0, 2}, {&a, &b}, y.data()), Error);      // negative start
  EXPECT_THROW(cpu_.grouped_linear(x.data(), {0, 1, 2}, {&a, &c}, y.data()), Error);       // shapes differ
  EXPECT_THROW(cpu_.grouped_linear(x.data(), {0, 1, 2}, {&a, nullptr}, y.data()), Error);  // null weight
  EXPECT_NO_THROW(cpu_.grouped_linear(x.data(), {0}, {}, y.data()));                        // no group
}

}  // namespace
}  // namespace shardlm
