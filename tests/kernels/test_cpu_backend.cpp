// CpuBackend: weight loading (F32 / BF16 in place, F16 converted), linear through the loaded
// matrix, ops delegating to the kernels, memory, and the backend registry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "compute/backend.h"
#include "common/expect_error.h"
#include "compute/cpu_backend.h"
#include "core/error.h"
#include "model/checkpoint.h"

using namespace shardlm;

namespace {

// Exact f32 -> f16 for values representable in f16 (normal range or zero).
uint16_t to_f16_exact(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) == 0) return sign;
  const int e = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  const uint32_t m = (u >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | (e << 10) | m);
}

uint16_t to_bf16_exact(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

TensorView view(const char* name, DType dt, std::vector<int64_t> shape, const void* data, size_t nbytes) {
  TensorView t;
  t.name = name;
  t.dtype = dt;
  t.shape = std::move(shape);
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

// W[n][k] = ((n*7 + k*3) % 33 - 16) / 8: multiples of 1/8 in [-2, 2], exact in bf16 and f16.
float wval(int64_t n, int64_t k) { return static_cast<float>((n * 7 + k * 3) % 33 - 16) / 8.0f; }

void check_linear(ComputeBackend& be, const Matrix& m, int64_t N, int64_t K, const Vector* bias) {
  const int64_t M = 5;
  std::vector<float> x(M * K), y(M * N);
  for (int64_t i = 0; i < M * K; ++i) x[i] = static_cast<float>(i % 11 - 5) / 4.0f;
  be.linear(x.data(), M, m, bias, y.data());
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double ref = bias ? bias->data[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) ref += static_cast<double>(x[r * K + k]) * wval(n, k);
      // Products of multiples of 1/8 and 1/4 sum exactly in fp32 at this size.
      ASSERT_EQ(y[r * N + n], static_cast<float>(ref)) << "r=" << r << " n=" << n;
    }
}

TEST(CpuBackend, LoadMatrixBf16InPlaceAndLinear) {
  auto be = make_backend("cpu");
  ASSERT_EQ(be->name(), "cpu");
  const int64_t N = 13, K = 40;
  std::vector<uint16_t> w(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = to_bf16_exact(wval(n, k));
  Matrix m = be->load_matrix(view("w", DType::BF16, {N, K}, w.data(), w.size() * 2));
  EXPECT_EQ(m.dtype, DType::BF16);
  EXPECT_EQ(m.rows, N);
  EXPECT_EQ(m.cols, K);
  EXPECT_EQ(m.data, static_cast<const void*>(w.data()));  // zero-copy
  check_linear(*be, m, N, K, nullptr);
}

TEST(CpuBackend, LoadMatrixF16ConvertedAndLinearWithBias) {
  auto be = make_backend("cpu");
  const int64_t N = 9, K = 33;
  std::vector<uint16_t> w(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = to_f16_exact(wval(n, k));
  Matrix m = be->load_matrix(view("w", DType::F16, {N, K}, w.data(), w.size() * 2));
  EXPECT_EQ(m.dtype, DType::F32);
  EXPECT_NE(m.data, static_cast<const void*>(w.data()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data) % 64, 0u);
  // Bias as bf16 vector -> fp32 copy.
  std::vector<uint16_t> b(N);
  for (int64_t n = 0; n < N; ++n) b[n] = to_bf16_exact(static_cast<float>(n) - 4.5f);
  Vector bias = be->load_vector(view("b", DType::BF16, {N}, b.data(), b.size() * 2));
  ASSERT_EQ(bias.n, N);
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(bias.data[n], static_cast<float>(n) - 4.5f);
  check_linear(*be, m, N, K, &bias);
}

TEST(CpuBackend, LoadMatrixF32InPlace) {
  auto be = make_backend("cpu");
  const int64_t N = 6, K = 16;
  std::vector<float> w(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = wval(n, k);
  Matrix m = be->load_matrix(view("w", DType::F32, {N, K}, w.data(), w.size() * 4));
  EXPECT_EQ(m.dtype, DType::F32);
  EXPECT_EQ(m.data, static_cast<const void*>(w.data()));
  check_linear(*be, m, N, K, nullptr);
  // load_vector always copies.
  Vector v = be->load_vector(view("v", DType::F32, {K}, w.data(), K * 4));
  EXPECT_NE(static_cast<const void*>(v.data), static_cast<const void*>(w.data()));
  for (int64_t k = 0; k < K; ++k) EXPECT_EQ(v.data[k], w[k]);
}

// A weight the backend cannot take fails at load naming the tensor and its file.
TEST(CpuBackend, LoadErrorsNameTheTensorAndFile) {
  auto be = make_backend("cpu");
  std::vector<int32_t> w(12);
  struct Case {
    bool matrix;
    DType dtype;
    std::vector<int64_t> shape;
    const char* why;
  };
  const Case cases[] = {{true, DType::I32, {3, 4}, "I32"},
                        {true, DType::F32, {12}, "a matrix needs 2"},
                        {false, DType::F32, {3, 4}, "a vector needs 1"},
                        {false, DType::I32, {12}, "I32"}};
  for (const Case& c : cases) {
    TensorView t = view(c.matrix ? "m.weight" : "n.weight", c.dtype, c.shape, w.data(), 48);
    t.file = "/ckpt/model-00002-of-00009.safetensors";
    test::expect_error(
        [&] {
          if (c.matrix) {
            be->load_matrix(t);
          } else {
            be->load_vector(t);
          }
        },
        {"'" + t.name + "'", "in " + t.file, c.why});
  }
}

// linear_parts: the parts of one input, each what linear() gives it bit for bit (bf16 with a
// bias; a mixed-dtype call takes the default path, one linear() a part); make_adjacent leaves the
// weights where they are (the CPU reads them in place); mismatched widths are refused.
TEST(CpuBackend, LinearPartsAreEachPartsLinear) {
  auto be = make_backend("cpu");
  const int64_t M = 3, K = 40, Nq = 24, Nk = 9;
  std::vector<uint16_t> wq(Nq * K), wk(Nk * K);
  std::vector<float> wk32(Nk * K), bias(Nq);
  for (int64_t n = 0; n < Nq; ++n)
    for (int64_t k = 0; k < K; ++k) wq[n * K + k] = to_bf16_exact(wval(n, k));
  for (int64_t n = 0; n < Nk; ++n)
    for (int64_t k = 0; k < K; ++k) wk32[n * K + k] = wval(n + 5, k);
  for (int64_t n = 0; n < Nk * K; ++n) wk[n] = to_bf16_exact(wk32[n]);
  for (int64_t n = 0; n < Nq; ++n) bias[n] = static_cast<float>(n) / 8.0f - 1.0f;
  Matrix q = be->load_matrix(view("q", DType::BF16, {Nq, K}, wq.data(), wq.size() * 2));
  Matrix k = be->load_matrix(view("k", DType::BF16, {Nk, K}, wk.data(), wk.size() * 2));
  Matrix k32 = be->load_matrix(view("k32", DType::F32, {Nk, K}, wk32.data(), wk32.size() * 4));
  Vector b = be->load_vector(view("b", DType::F32, {Nq}, bias.data(), bias.size() * 4));
  Matrix* stack[] = {&q, &k};
  EXPECT_FALSE(be->make_adjacent(stack));
  EXPECT_EQ(q.data, static_cast<const void*>(wq.data()));
  std::vector<float> x(M * K);
  for (int64_t i = 0; i < M * K; ++i) x[i] = static_cast<float>(i % 13 - 6) / 3.0f;
  for (const Matrix* second : {&k, &k32}) {
    std::vector<float> yq(M * Nq), yk(M * Nk), wantq(M * Nq), wantk(M * Nk);
    const LinearPart parts[] = {{&q, &b, yq.data()}, {second, nullptr, yk.data()}};
    be->linear_parts(x.data(), M, parts);
    be->linear(x.data(), M, q, &b, wantq.data());
    be->linear(x.data(), M, *second, nullptr, wantk.data());
    EXPECT_EQ(0, std::memcmp(yq.data(), wantq.data(), yq.size() * 4));
    EXPECT_EQ(0, std::memcmp(yk.data(), wantk.data(), yk.size() * 4));
  }
  Matrix narrow = q;
  narrow.cols = K - 1;
  std::vector<float> y(M * Nq);
  const LinearPart bad[] = {{&q, nullptr, y.data()}, {&narrow, nullptr, y.data()}};
  EXPECT_THROW(be->linear_parts(x.data(), M, bad), Error);
}

// The CPU's GEMMs read fp32 rows: it asks for no twins, but writes one asked for (the rounding of
// each fp32 output), leaves the fp32 outputs as they are without one, and a linear given a twin
// reads the fp32 rows, whatever the twin holds.
TEST(CpuBackend, TwinsAreWrittenWhenAskedAndNotRead) {
  auto be = make_backend("cpu");
  EXPECT_FALSE(be->wants_bf16_twins());
  const int64_t rows = 3, dim = 20, n = rows * dim;
  std::vector<float> x(n), w(dim), res(n), up(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::sin(static_cast<float>(i)) * 2.0f;
    res[i] = std::cos(static_cast<float>(i));
    up[i] = static_cast<float>(i % 7) / 3.0f - 1.0f;
  }
  for (int64_t i = 0; i < dim; ++i) w[i] = 0.5f + static_cast<float>(i) / dim;
  const Vector wv = be->load_vector(view("w", DType::F32, {dim}, w.data(), w.size() * 4));
  auto rounded = [](const std::vector<float>& v) {
    std::vector<uint16_t> t(v.size());
    for (size_t i = 0; i < v.size(); ++i) t[i] = f32_to_bf16(v[i]);
    return t;
  };
  std::vector<float> plain(n), out(n), res_plain = res, res_twin = res;
  std::vector<uint16_t> twin(n, 0xdead);
  be->rmsnorm(x.data(), wv, rows, 1e-5f, plain.data());
  be->rmsnorm(x.data(), wv, rows, 1e-5f, {out.data(), twin.data()});
  EXPECT_EQ(0, std::memcmp(out.data(), plain.data(), n * 4));
  EXPECT_EQ(twin, rounded(out));
  be->add_rmsnorm(res_plain.data(), x.data(), wv, rows, 1e-5f, plain.data());
  be->add_rmsnorm(res_twin.data(), x.data(), wv, rows, 1e-5f, {out.data(), twin.data()});
  EXPECT_EQ(0, std::memcmp(out.data(), plain.data(), n * 4));
  EXPECT_EQ(twin, rounded(out));
  be->silu_mul(x.data(), up.data(), plain.data(), n);
  be->silu_mul(x.data(), up.data(), {out.data(), twin.data()}, n);
  EXPECT_EQ(0, std::memcmp(out.data(), plain.data(), n * 4));
  EXPECT_EQ(twin, rounded(out));
  // A linear with a twin that disagrees with its rows: the rows decide.
  std::vector<float> wm(5 * dim);
  for (size_t i = 0; i < wm.size(); ++i) wm[i] = static_cast<float>(i % 11) / 10.0f - 0.5f;
  const Matrix m = be->load_matrix(view("m", DType::F32, {5, dim}, wm.data(), wm.size() * 4));
  std::fill(twin.begin(), twin.end(), uint16_t{0x4000});  // 2.0 everywhere
  std::vector<float> y(rows * 5), y_twin(rows * 5);
  be->linear(out.data(), rows, m, nullptr, y.data());
  be->linear(Activations{out.data(), twin.data()}, rows, m, nullptr, y_twin.data());
  EXPECT_EQ(0, std::memcmp(y.data(), y_twin.data(), y.size() * 4));
}

TEST(CpuBackend, RejectsBadTensors) {
  auto be = make_backend("cpu");
  std::vector<float> d(8);
  EXPECT_THROW(be->load_matrix(view("v", DType::F32, {8}, d.data(), 32)), Error);
  EXPECT_THROW(be->load_matrix(view("i", DType::I32, {2, 4}, d.data(), 32)), Error);
  EXPECT_THROW(be->load_vector(view("m", DType::F32, {2, 4}, d.data(), 32)), Error);
}

TEST(CpuBackend, MemoryAndOps) {
  auto be = make_backend("cpu");
  float* a = static_cast<float*>(be->alloc(100 * sizeof(float)));
  float* b = static_cast<float*>(be->alloc(100 * sizeof(float)));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  std::vector<float> h(100), back(100);
  for (int i = 0; i < 100; ++i) h[i] = static_cast<float>(i);
  be->copy_to_device(a, h.data(), 400);
  be->copy_to_device(b, h.data(), 400);
  be->add(a, b, 100);
  be->copy_to_host(back.data(), a, 400);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(back[i], 2.0f * i);
  // embedding through a bf16 table matrix
  std::vector<uint16_t> table(4 * 3);
  for (int i = 0; i < 12; ++i) table[i] = to_bf16_exact(static_cast<float>(i));
  Matrix tm = be->load_matrix(view("emb", DType::BF16, {4, 3}, table.data(), 24));
  int32_t ids[2] = {3, 1};
  float out[6];
  be->embedding(ids, 2, tm, out);
  const float want[6] = {9, 10, 11, 3, 4, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], want[i]);
  be->free(a);
  be->free(b);
  be->free(nullptr);
  // rmsnorm through a Vector
  std::vector<float> ones(4, 1.0f);
  Vector w = be->load_vector(view("n", DType::F32, {4}, ones.data(), 16));
  float x[4] = {2, 2, 2, 2}, y[4];
  be->rmsnorm(x, w, 1, 0.0f, y);
  for (float e : y) EXPECT_FLOAT_EQ(e, 1.0f);
}

TEST(BackendRegistry, NamesAndUnknown) {
  auto names = backend_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "cpu");
  try {
    make_backend("tpu");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
}

}  // namespace
