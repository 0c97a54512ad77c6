// rmsnorm, add_rmsnorm, rope, silu_mul, add_inplace, embedding against double-precision references.
// Tolerances (relative to the magnitude of the result):
//   rmsnorm: 1e-5 relative (fp32 sum of squares over dim <= 4096, one sqrt, two products);
//   rope: 2e-6 * (|x1| + |x2|) absolute per element for |angle| < 1e4 (cosf/sinf of an fp32 angle
//         vs the same fp32 angle in double; the fp32 angle itself is what Hugging Face uses);
//   silu_mul: 1e-6 relative + 1e-30; add and embeddings: exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/activation.h"
#include "cpu/embedding.h"
#include "cpu/rmsnorm.h"
#include "cpu/rope.h"
#include "cpu/threads.h"

using namespace shardlm;

namespace {

std::vector<float> rand_vec(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

void ref_rmsnorm(const float* x, const float* w, int64_t dim, float eps, double* out) {
  double ss = 0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / dim + eps);
  for (int64_t i = 0; i < dim; ++i) out[i] = w[i] * (x[i] * r);
}

TEST(RmsNorm, MatchesReference) {
  for (int64_t dim : {1, 7, 64, 1024, 1000, 4096}) {
    const int64_t rows = 37;
    auto x = rand_vec(rows * dim, 1 + dim), w = rand_vec(dim, 2 + dim, 0.5f, 1.5f);
    std::vector<float> out(rows * dim);
    cpu::rmsnorm(x.data(), w.data(), rows, dim, 1e-5f, out.data());
    std::vector<double> ref(dim);
    for (int64_t r = 0; r < rows; ++r) {
      ref_rmsnorm(&x[r * dim], w.data(), dim, 1e-5f, ref.data());
      for (int64_t i = 0; i < dim; ++i)
        ASSERT_NEAR(out[r * dim + i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-7) << "dim=" << dim;
    }
    // In place (out aliases x) gives the same bits.
    auto xi = x;
    cpu::rmsnorm(xi.data(), w.data(), rows, dim, 1e-5f, xi.data());
    ASSERT_EQ(0, std::memcmp(xi.data(), out.data(), out.size() * 4));
  }
}

TEST(RmsNorm, AddRmsNormFused) {
  const int64_t rows = 300, dim = 1024;  // big enough to run on threads
  auto res = rand_vec(rows * dim, 3), x = rand_vec(rows * dim, 4), w = rand_vec(dim, 5);
  auto res_ref = res;
  for (size_t i = 0; i < res.size(); ++i) res_ref[i] += x[i];
  std::vector<float> out(rows * dim), out_ref(rows * dim);
  cpu::add_rmsnorm(res.data(), x.data(), w.data(), rows, dim, 1e-6f, out.data());
  ASSERT_EQ(0, std::memcmp(res.data(), res_ref.data(), res.size() * 4));
  cpu::rmsnorm(res_ref.data(), w.data(), rows, dim, 1e-6f, out_ref.data());
  ASSERT_EQ(0, std::memcmp(out.data(), out_ref.data(), out.size() * 4));
  // Row-invariant: one row alone gives the same bits.
  auto r1 = rand_vec(rows * dim, 3);
  std::vector<float> o1(dim);
  cpu::add_rmsnorm(&r1[5 * dim], &x[5 * dim], w.data(), 1, dim, 1e-6f, o1.data());
  ASSERT_EQ(0, std::memcmp(o1.data(), &out[5 * dim], dim * 4));
}

TEST(Rope, MatchesReferenceRotateHalf) {
  const int64_t T = 9, H = 3, D = 64, half = D / 2;
  auto x = rand_vec(T * H * D, 6);
  std::vector<int32_t> pos = {0, 1, 2, 5, 17, 100, 511, 2047, 8191};
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / D));
  auto y = x;
  cpu::rope_rotate_half(y.data(), T, H, D, pos.data(), inv.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const float a = static_cast<float>(pos[t]) * inv[i];  // fp32 angle, as HF
        const double c = std::cos(static_cast<double>(a)), s = std::sin(static_cast<double>(a));
        const float* v = &x[(t * H + h) * D];
        const double r1 = v[i] * c - v[i + half] * s, r2 = v[i + half] * c + v[i] * s;
        const double tol = 2e-6 * (std::fabs(v[i]) + std::fabs(v[i + half]));
        ASSERT_NEAR(y[(t * H + h) * D + i], r1, tol) << "t=" << t << " i=" << i;
        ASSERT_NEAR(y[(t * H + h) * D + i + half], r2, tol) << "t=" << t << " i=" << i;
      }
  // Position 0 is the identity.
  for (int64_t i = 0; i < H * D; ++i) ASSERT_EQ(y[i], x[i]);
}

TEST(Activation, SiluMulAndAdd) {
  const int64_t n = 100000;  // threaded path
  auto g = rand_vec(n, 7, -20.0f, 20.0f), u = rand_vec(n, 8);
  std::vector<float> out(n);
  cpu::silu_mul(g.data(), u.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    ASSERT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << "i=" << i;
  }
  auto ga = g;  // out may alias gate
  cpu::silu_mul(ga.data(), u.data(), ga.data(), n);
  ASSERT_EQ(0, std::memcmp(ga.data(), out.data(), n * 4));

  auto y = rand_vec(n, 9), x = rand_vec(n, 10);
  auto ref = y;
  for (int64_t i = 0; i < n; ++i) ref[i] += x[i];
  cpu::add_inplace(y.data(), x.data(), n);
  ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), n * 4));
}

TEST(Embedding, GatherF32AndBf16) {
  const int64_t V = 50, D = 33;
  auto tf = rand_vec(V * D, 11);
  std::vector<uint16_t> tb(V * D);
  for (int64_t i = 0; i < V * D; ++i) {
    uint32_t u;
    std::memcpy(&u, &tf[i], 4);
    tb[i] = static_cast<uint16_t>(u >> 16);
  }
  std::vector<int32_t> ids = {0, 49, 3, 3, 17};
  std::vector<float> of(ids.size() * D), ob(ids.size() * D);
  cpu::embedding_f32(ids.data(), ids.size(), tf.data(), D, of.data());
  cpu::embedding_bf16(ids.data(), ids.size(), tb.data(), D, ob.data());
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < D; ++i) {
      ASSERT_EQ(of[t * D + i], tf[ids[t] * D + i]);
      uint32_t u = static_cast<uint32_t>(tb[ids[t] * D + i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      ASSERT_EQ(ob[t * D + i], f);
    }
}

}  // namespace
