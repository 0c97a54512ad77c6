// matmul_f32w / matmul_bf16w: accuracy against a double-precision reference and batch invariance.
//
// Tolerance: |y - ref| <= 1e-5 * sum_k |x_k||w_k| + 1e-30 (fp32 accumulation over K in 16-lane
// partial sums has error bounded by ~(K/16 + 4) * 2^-24 * sum|x||w|; 1e-5 covers K up to ~2800
// with margin, and is checked up to K = 2816).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/threads.h"

using namespace shardlm;

namespace {

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Problem {
  int64_t M, N, K;
  std::vector<float> x, wf, bias;
  std::vector<uint16_t> wb;
  Problem(int64_t M_, int64_t N_, int64_t K_, uint32_t seed) : M(M_), N(N_), K(K_) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    x.resize(M * K);
    wf.resize(N * K);
    wb.resize(N * K);
    bias.resize(N);
    for (auto& v : x) v = U(rng);
    for (int64_t i = 0; i < N * K; ++i) {
      wb[i] = to_bf16(U(rng));
      wf[i] = from_bf16(wb[i]);  // the same values in both layouts
    }
    for (auto& v : bias) v = U(rng);
  }
};

void check_against_reference(const Problem& p, const std::vector<float>& y, bool with_bias) {
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double ref = with_bias ? p.bias[n] : 0.0, mag = 0.0;
      for (int64_t k = 0; k < p.K; ++k) {
        ref += static_cast<double>(p.x[m * p.K + k]) * p.wf[n * p.K + k];
        mag += std::fabs(static_cast<double>(p.x[m * p.K + k]) * p.wf[n * p.K + k]);
      }
      const double tol = 1e-5 * (mag + (with_bias ? std::fabs(p.bias[n]) : 0.0)) + 1e-30;
      ASSERT_NEAR(y[m * p.N + n], ref, tol) << "m=" << m << " n=" << n << " M=" << p.M << " N=" << p.N
                                            << " K=" << p.K;
    }
}

class MatmulShapes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(MatmulShapes, MatchesDoubleReference) {
  auto [M, N, K] = GetParam();
  Problem p(M, N, K, 7u + M * 31 + N * 17 + K);
  std::vector<float> y(M * N);
  for (bool bias : {false, true}) {
    cpu::matmul_f32w(p.x.data(), M, K, p.wf.data(), N, bias ? p.bias.data() : nullptr, y.data());
    check_against_reference(p, y, bias);
    std::vector<float> yb(M * N);
    cpu::matmul_bf16w(p.x.data(), M, K, p.wb.data(), N, bias ? p.bias.data() : nullptr, yb.data());
    check_against_reference(p, yb, bias);
    // bf16 -> fp32 conversion is exact, so both weight layouts give identical bits.
    ASSERT_EQ(0, std::memcmp(y.data(), yb.data(), y.size() * sizeof(float)));
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, MatmulShapes,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(1, 7, 15),
                                           std::make_tuple(3, 13, 16), std::make_tuple(5, 33, 17),
                                           std::make_tuple(17, 50, 100), std::make_tuple(4, 6, 64),
                                           std::make_tuple(9, 64, 1023), std::make_tuple(2, 19, 2816),
                                           std::make_tuple(1, 257, 1024), std::make_tuple(70, 37, 33)));

// Row r of y must be bit-identical whatever M, the row's position in the batch and the thread count.
void batch_invariance(bool bf16, int64_t N, int64_t K) {
  const int64_t Mmax = 300;
  Problem p(Mmax, N, K, 99u + K);
  const int saved = cpu::num_threads();
  // Reference: each row alone (M = 1), one thread.
  cpu::set_num_threads(1);
  std::vector<float> ref(Mmax * N);
  for (int64_t m = 0; m < Mmax; ++m) {
    if (bf16)
      cpu::matmul_bf16w(&p.x[m * K], 1, K, p.wb.data(), N, p.bias.data(), &ref[m * N]);
    else
      cpu::matmul_f32w(&p.x[m * K], 1, K, p.wf.data(), N, p.bias.data(), &ref[m * N]);
  }
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    for (int64_t M : {1, 3, 17, 64, 300}) {
      for (int64_t off : {int64_t(0), Mmax - M}) {  // the rows land in different tiles
        std::vector<float> y(M * N);
        if (bf16)
          cpu::matmul_bf16w(&p.x[off * K], M, K, p.wb.data(), N, p.bias.data(), y.data());
        else
          cpu::matmul_f32w(&p.x[off * K], M, K, p.wf.data(), N, p.bias.data(), y.data());
        ASSERT_EQ(0, std::memcmp(y.data(), &ref[off * N], M * N * sizeof(float)))
            << "bf16=" << bf16 << " M=" << M << " off=" << off << " threads=" << threads << " N=" << N
            << " K=" << K;
      }
    }
  }
  cpu::set_num_threads(saved);
}

TEST(MatmulBatchInvariance, Bf16Weights) {
  batch_invariance(true, 96, 1024);
  batch_invariance(true, 45, 77);  // K and N tails
}
TEST(MatmulBatchInvariance, F32Weights) {
  batch_invariance(false, 96, 1024);
  batch_invariance(false, 45, 77);
}

TEST(MatmulBatchInvariance, LargeNSplitAcrossThreads) {
  // N large enough that both threads take part for every M.
  const int64_t N = 1000, K = 256;
  Problem p(64, N, K, 5u);
  const int saved = cpu::num_threads();
  cpu::set_num_threads(2);
  std::vector<float> all(64 * N), one(N);
  cpu::matmul_bf16w(p.x.data(), 64, K, p.wb.data(), N, nullptr, all.data());
  cpu::set_num_threads(1);
  for (int64_t m : {0, 1, 13, 63}) {
    cpu::matmul_bf16w(&p.x[m * K], 1, K, p.wb.data(), N, nullptr, one.data());
    ASSERT_EQ(0, std::memcmp(one.data(), &all[m * N], N * sizeof(float))) << "m=" << m;
  }
  cpu::set_num_threads(saved);
}

// matmul_parts: each part's bits are matmul_*w's on that part alone, for decode and batch row
// counts, parts of different widths (tails of the tile width included, an empty one too), with
// and without biases, on one thread and two.
TEST(MatmulParts, EachPartIsItsOwnMatmulBitForBit) {
  const int64_t K = 300;
  const int saved = cpu::num_threads();
  for (int64_t M : {1, 5, 64}) {
    // q, k, v of a GQA layer (widths off the tile grid), an empty part, and a single row.
    std::vector<Problem> ps;
    int seed = 0;
    for (int64_t N : {130, 38, 38, 0, 1}) ps.emplace_back(M, N, K, 100u + static_cast<uint32_t>(seed++));
    for (auto& p : ps) p.x = ps[0].x;  // one input
    for (int threads : {1, 2}) {
      cpu::set_num_threads(threads);
      for (bool bf16 : {false, true}) {
        std::vector<std::vector<float>> got(ps.size()), want(ps.size());
        std::vector<cpu::MatmulPart<float>> pf;
        std::vector<cpu::MatmulPart<uint16_t>> pb;
        for (size_t i = 0; i < ps.size(); ++i) {
          Problem& p = ps[i];
          got[i].assign(static_cast<size_t>(M * p.N), -1.0f);
          want[i].resize(static_cast<size_t>(M * p.N));
          const float* bias = i % 2 == 0 ? p.bias.data() : nullptr;
          if (bf16) {
            cpu::matmul_bf16w(p.x.data(), M, K, p.wb.data(), p.N, bias, want[i].data());
            pb.push_back({p.wb.data(), p.N, bias, got[i].data()});
          } else {
            cpu::matmul_f32w(p.x.data(), M, K, p.wf.data(), p.N, bias, want[i].data());
            pf.push_back({p.wf.data(), p.N, bias, got[i].data()});
          }
        }
        if (bf16)
          cpu::matmul_parts_bf16w(ps[0].x.data(), M, K, pb.data(), static_cast<int64_t>(pb.size()));
        else
          cpu::matmul_parts_f32w(ps[0].x.data(), M, K, pf.data(), static_cast<int64_t>(pf.size()));
        for (size_t i = 0; i < ps.size(); ++i)
          ASSERT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)))
              << "part " << i << " M=" << M << " bf16=" << bf16 << " threads=" << threads;
      }
    }
  }
  cpu::set_num_threads(saved);
}

}  // namespace
