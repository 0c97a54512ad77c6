// The CUDA model-op kernels against their CPU references (kernels/cpu), on random inputs with
// fixed seeds. Tolerances:
//  * exact (bit for bit): embedding, add_inplace, add_bias_rows, the bf16 casts, and the residual
//    of add_rmsnorm: the same single fp32 operation per element on both sides;
//  * rmsnorm / add_rmsnorm output: relative 1e-5 (only the order of the sum of squares differs);
//  * silu_mul: relative 1e-5 + 1e-7 (CUDA expf is within 2 ulp of the host's);
//  * rope: relative 1e-5 + absolute 2e-6 (cosf / sinf differ by an ulp or two, and x1*c - x2*s may
//    cancel, so an absolute part on |x| <= 1 inputs);
//  * head_matmul: 1e-5 * sum_k |x_k w_k| + 1e-6 per element (a different summation order over K).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "common/gpu.h"
#include "core/dtype.h"
#include "cpu/activation.h"
#include "cpu/embedding.h"
#include "cpu/head_matmul.h"
#include "cpu/rmsnorm.h"
#include "cpu/rope.h"
#include "cpu/rope_strided.h"
#include "cuda/activation.h"
#include "cuda/compare.h"
#include "cuda/device_buffer.h"
#include "cuda/elementwise.h"
#include "cuda/embedding.h"
#include "cuda/head_matmul.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"

using namespace shardlm;
using test::all_bits_equal;
using test::all_close;
using test::cuda_sync;
using test::DeviceBuffer;

namespace {

std::vector<float> rand_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

// Hugging Face's default rope table: inv_freq[i] = theta^(-2i / dim).
std::vector<float> inv_freq_table(int64_t rot_dim, double theta) {
  std::vector<float> f(rot_dim / 2);
  for (int64_t i = 0; i < rot_dim / 2; ++i)
    f[i] = static_cast<float>(1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / static_cast<double>(rot_dim)));
  return f;
}

std::vector<int32_t> rand_pos(int64_t T, uint32_t seed, int32_t max_pos) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> U(0, max_pos);
  std::vector<int32_t> p(T);
  for (auto& e : p) e = U(rng);
  return p;
}

}  // namespace

TEST(CudaModelKernels, EmbeddingMatchesCpuExactly) {
  SHARDLM_REQUIRE_GPU();
  const int64_t vocab = 1000;
  for (int64_t dim : {int64_t{1}, int64_t{333}, int64_t{4096}}) {
    // A padding id (-1), the first and the last row, and repeats.
    const std::vector<int32_t> ids = {5, -1, 0, 999, 5, 417, -7};
    const int64_t T = static_cast<int64_t>(ids.size());
    const std::vector<float> table = rand_vec(static_cast<size_t>(vocab * dim), 11);
    const std::vector<uint16_t> table_bf = to_bf16(rand_vec(static_cast<size_t>(vocab * dim), 12));
    std::vector<float> want_f(T * dim), want_b(T * dim);
    cpu::embedding_f32(ids.data(), T, table.data(), dim, want_f.data());
    cpu::embedding_bf16(ids.data(), T, table_bf.data(), dim, want_b.data());

    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_table(table), d_out_f(T * dim), d_out_b(T * dim);
    DeviceBuffer<uint16_t> d_table_bf(table_bf);
    cuda::embedding_f32(d_ids.get(), T, d_table.get(), dim, d_out_f.get(), nullptr);
    cuda::embedding_bf16(d_ids.get(), T, d_table_bf.get(), dim, d_out_b.get(), nullptr);
    cuda_sync("embedding");
    EXPECT_TRUE(all_bits_equal(d_out_f.download(), want_f)) << "f32 table, dim " << dim;
    EXPECT_TRUE(all_bits_equal(d_out_b.download(), want_b)) << "bf16 table, dim " << dim;
  }
}

TEST(CudaModelKernels, RmsnormMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  const float eps = 1e-6f;
  for (int64_t rows : {int64_t{1}, int64_t{7}}) {
    for (int64_t dim : {int64_t{1001}, int64_t{4096}, int64_t{7168}}) {
      const std::vector<float> x = rand_vec(rows * dim, 21, -3.0f, 3.0f);
      const std::vector<float> w = rand_vec(dim, 22, 0.5f, 1.5f);
      std::vector<float> want(rows * dim);
      cpu::rmsnorm(x.data(), w.data(), rows, dim, eps, want.data());

      DeviceBuffer<float> d_x(x), d_w(w), d_out(rows * dim);
      cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, eps, d_out.get(), nullptr, nullptr);
      cuda_sync("rmsnorm");
      EXPECT_TRUE(all_close(d_out.download(), want, 1e-5, 0.0)) << rows << " x " << dim;
      // In place, as the decoder calls it.
      cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, eps, d_x.get(), nullptr, nullptr);
      cuda_sync("rmsnorm in place");
      EXPECT_TRUE(all_close(d_x.download(), want, 1e-5, 0.0)) << "in place, " << rows << " x " << dim;
    }
  }
}

TEST(CudaModelKernels, AddRmsnormMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  const float eps = 1e-5f;
  for (int64_t rows : {int64_t{1}, int64_t{9}}) {
    for (int64_t dim : {int64_t{333}, int64_t{4096}}) {
      const std::vector<float> res = rand_vec(rows * dim, 31, -2.0f, 2.0f);
      const std::vector<float> x = rand_vec(rows * dim, 32);
      const std::vector<float> w = rand_vec(dim, 33, 0.5f, 1.5f);
      std::vector<float> want_res = res, want(rows * dim);
      cpu::add_rmsnorm(want_res.data(), x.data(), w.data(), rows, dim, eps, want.data());

      DeviceBuffer<float> d_res(res), d_x(x), d_w(w), d_out(rows * dim);
      cuda::add_rmsnorm(d_res.get(), d_x.get(), d_w.get(), rows, dim, eps, d_out.get(), nullptr, nullptr);
      cuda_sync("add_rmsnorm");
      EXPECT_TRUE(all_bits_equal(d_res.download(), want_res)) << rows << " x " << dim;
      EXPECT_TRUE(all_close(d_out.download(), want, 1e-5, 0.0)) << rows << " x " << dim;
    }
  }
}

TEST(CudaModelKernels, RopeRotateHalfMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  for (int64_t head_dim : {int64_t{64}, int64_t{128}}) {
    for (int64_t T : {int64_t{1}, int64_t{37}}) {
      const int64_t n_heads = 8;
      const std::vector<float> x = rand_vec(T * n_heads * head_dim, 41);
      const std::vector<int32_t> pos = rand_pos(T, 42, 8191);
      const std::vector<float> inv_freq = inv_freq_table(head_dim, 500000.0);
      std::vector<float> want = x;
      cpu::rope_rotate_half(want.data(), T, n_heads, head_dim, pos.data(), inv_freq.data());

      DeviceBuffer<float> d_x(x), d_f(inv_freq);
      DeviceBuffer<int32_t> d_pos(pos);
      cuda::rope_rotate_half(d_x.get(), T, n_heads, head_dim, d_pos.get(), d_f.get(), nullptr);
      cuda_sync("rope_rotate_half");
      EXPECT_TRUE(all_close(d_x.download(), want, 1e-5, 2e-6)) << "head_dim " << head_dim << ", T " << T;
    }
  }
}

// Queries and keys in one launch: bit for bit two launches of rope_rotate_half (the same
// arithmetic per element), and the CPU's within rope's tolerance.
TEST(CudaModelKernels, RopeQueriesAndKeysInOneLaunch) {
  SHARDLM_REQUIRE_GPU();
  const int64_t head_dim = 64, q_heads = 8, k_heads = 2;
  for (int64_t T : {int64_t{1}, int64_t{19}}) {
    const std::vector<float> q = rand_vec(T * q_heads * head_dim, 51), k = rand_vec(T * k_heads * head_dim, 52);
    const std::vector<int32_t> pos = rand_pos(T, 53, 8191);
    const std::vector<float> inv_freq = inv_freq_table(head_dim, 10000.0);
    DeviceBuffer<float> d_q(q), d_k(k), d_q2(q), d_k2(k), d_f(inv_freq);
    DeviceBuffer<int32_t> d_pos(pos);
    cuda::rope_rotate_half_qk(d_q.get(), q_heads, d_k.get(), k_heads, T, head_dim, d_pos.get(), d_f.get(), nullptr);
    cuda::rope_rotate_half(d_q2.get(), T, q_heads, head_dim, d_pos.get(), d_f.get(), nullptr);
    cuda::rope_rotate_half(d_k2.get(), T, k_heads, head_dim, d_pos.get(), d_f.get(), nullptr);
    cuda_sync("rope_rotate_half_qk");
    EXPECT_TRUE(all_bits_equal(d_q.download(), d_q2.download())) << "T " << T;
    EXPECT_TRUE(all_bits_equal(d_k.download(), d_k2.download())) << "T " << T;
    std::vector<float> want_q = q, want_k = k;
    cpu::rope_rotate_half(want_q.data(), T, q_heads, head_dim, pos.data(), inv_freq.data());
    cpu::rope_rotate_half(want_k.data(), T, k_heads, head_dim, pos.data(), inv_freq.data());
    EXPECT_TRUE(all_close(d_q.download(), want_q, 1e-5, 2e-6)) << "T " << T;
    EXPECT_TRUE(all_close(d_k.download(), want_k, 1e-5, 2e-6)) << "T " << T;
  }
}

TEST(CudaModelKernels, RopeStridedMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  // MLA queries: per head [nope 128 | rope 64] inside a [T, n_heads, 192] tensor; the rope half is
  // read with strides and written packed.
  const int64_t n_heads = 16, nope = 128, rot = 64, qk = nope + rot;
  const std::vector<float> inv_freq = inv_freq_table(rot, 10000.0);
  DeviceBuffer<float> d_f(inv_freq);
  for (int64_t T : {int64_t{1}, int64_t{29}}) {
    const std::vector<float> q = rand_vec(T * n_heads * qk, 51);
    const std::vector<int32_t> pos = rand_pos(T, 52, 4095);
    DeviceBuffer<float> d_q(q), d_out(T * n_heads * rot);
    DeviceBuffer<int32_t> d_pos(pos);
    for (bool interleaved : {false, true}) {
      const float factor = interleaved ? 1.2079f : 1.0f;  // YaRN's attention_factor, or none
      std::vector<float> want(T * n_heads * rot);
      cpu::rope_strided(q.data() + nope, T, n_heads, n_heads * qk, qk, rot, pos.data(), inv_freq.data(), interleaved,
                        factor, want.data());
      cuda::rope_strided(d_q.get() + nope, T, n_heads, n_heads * qk, qk, rot, d_pos.get(), d_f.get(), interleaved,
                         factor, d_out.get(), nullptr);
      cuda_sync("rope_strided");
      EXPECT_TRUE(all_close(d_out.download(), want, 1e-5, 2e-6)) << "T " << T << ", interleaved " << interleaved;
    }
    // The shared key: one head, packed, rotated in place (out == x), interleaved.
    const std::vector<float> k = rand_vec(T * rot, 53);
    std::vector<float> want = k;
    cpu::rope_strided(want.data(), T, 1, rot, rot, rot, pos.data(), inv_freq.data(), true, 1.0f, want.data());
    DeviceBuffer<float> d_k(k);
    cuda::rope_strided(d_k.get(), T, 1, rot, rot, rot, d_pos.get(), d_f.get(), true, 1.0f, d_k.get(), nullptr);
    cuda_sync("rope_strided in place");
    EXPECT_TRUE(all_close(d_k.download(), want, 1e-5, 2e-6)) << "in place, T " << T;
  }
}

TEST(CudaModelKernels, SiluMulMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{10007}, int64_t{3 * 18432}}) {
    const std::vector<float> gate = rand_vec(n, 61, -12.0f, 12.0f);
    const std::vector<float> up = rand_vec(n, 62, -3.0f, 3.0f);
    std::vector<float> want(n);
    cpu::silu_mul(gate.data(), up.data(), want.data(), n);

    DeviceBuffer<float> d_gate(gate), d_up(up), d_out(n);
    cuda::silu_mul(d_gate.get(), d_up.get(), d_out.get(), nullptr, n, nullptr);
    cuda_sync("silu_mul");
    EXPECT_TRUE(all_close(d_out.download(), want, 1e-5, 1e-7)) << "n " << n;
    cuda::silu_mul(d_gate.get(), d_up.get(), d_gate.get(), nullptr, n, nullptr);  // out aliasing gate
    cuda_sync("silu_mul in place");
    EXPECT_TRUE(all_close(d_gate.download(), want, 1e-5, 1e-7)) << "in place, n " << n;
  }
}

// The bf16 twins rmsnorm, add_rmsnorm and silu_mul write for the GEMMs after them: each is the
// host's rounding of the fp32 output, bit for bit (NaN and infinities included), and writing one
// changes no bit of the fp32 output. In place, as the layers call them.
TEST(CudaModelKernels, TwinsAreTheOutputsRoundedToBf16) {
  SHARDLM_REQUIRE_GPU();
  const float eps = 1e-6f, inf = std::numeric_limits<float>::infinity();
  const int64_t rows = 5, dim = 1001, n = rows * dim;
  std::vector<float> x = rand_vec(n, 81, -3.0f, 3.0f);
  x[2 * dim + 7] = std::numeric_limits<float>::quiet_NaN();  // a whole row of NaN out
  x[3 * dim] = 3.0e38f;                                      // a row whose sum of squares overflows
  const std::vector<float> w = rand_vec(dim, 82, 0.5f, 1.5f), res = rand_vec(n, 83, -2.0f, 2.0f);
  std::vector<float> gate = rand_vec(n, 84, -12.0f, 12.0f), up = rand_vec(n, 85, -3.0f, 3.0f);
  gate[1] = inf;
  gate[2] = -inf;  // -inf / (1 + inf): NaN
  uint32_t payload = 0x7fa12345u;
  std::memcpy(&up[3], &payload, sizeof payload);  // a signalling NaN's payload, quieted in bf16
  const auto twin_of = [](const std::vector<float>& v) {
    std::vector<uint16_t> t(v.size());
    for (size_t i = 0; i < v.size(); ++i) t[i] = f32_to_bf16(v[i]);
    return t;
  };

  DeviceBuffer<float> d_w(w), d_plain(x), d_x(x);
  DeviceBuffer<uint16_t> d_twin(n);
  cuda::rmsnorm(d_plain.get(), d_w.get(), rows, dim, eps, d_plain.get(), nullptr, nullptr);
  cuda::rmsnorm(d_x.get(), d_w.get(), rows, dim, eps, d_x.get(), d_twin.get(), nullptr);
  cuda_sync("rmsnorm with a twin");
  std::vector<float> out = d_x.download();
  EXPECT_TRUE(all_bits_equal(out, d_plain.download())) << "rmsnorm";
  EXPECT_EQ(d_twin.download(), twin_of(out)) << "rmsnorm";

  DeviceBuffer<float> d_res_plain(res), d_res(res), d_h_plain(x), d_h(x);
  cuda::add_rmsnorm(d_res_plain.get(), d_h_plain.get(), d_w.get(), rows, dim, eps, d_h_plain.get(), nullptr, nullptr);
  cuda::add_rmsnorm(d_res.get(), d_h.get(), d_w.get(), rows, dim, eps, d_h.get(), d_twin.get(), nullptr);
  cuda_sync("add_rmsnorm with a twin");
  out = d_h.download();
  EXPECT_TRUE(all_bits_equal(out, d_h_plain.download())) << "add_rmsnorm";
  EXPECT_TRUE(all_bits_equal(d_res.download(), d_res_plain.download())) << "add_rmsnorm's residual";
  EXPECT_EQ(d_twin.download(), twin_of(out)) << "add_rmsnorm";

  DeviceBuffer<float> d_gate_plain(gate), d_gate(gate), d_up(up);
  cuda::silu_mul(d_gate_plain.get(), d_up.get(), d_gate_plain.get(), nullptr, n, nullptr);
  cuda::silu_mul(d_gate.get(), d_up.get(), d_gate.get(), d_twin.get(), n, nullptr);
  cuda_sync("silu_mul with a twin");
  out = d_gate.download();
  EXPECT_TRUE(all_bits_equal(out, d_gate_plain.download())) << "silu_mul";
  EXPECT_EQ(d_twin.download(), twin_of(out)) << "silu_mul";
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]) && std::isinf(out[1])) << "the special values reach the output";
}

TEST(CudaModelKernels, AddsMatchCpuExactly) {
  SHARDLM_REQUIRE_GPU();
  const int64_t M = 7, N = 1001;
  const std::vector<float> y = rand_vec(M * N, 71), x = rand_vec(M * N, 72), bias = rand_vec(N, 73);
  std::vector<float> want_add = y;
  cpu::add_inplace(want_add.data(), x.data(), M * N);
  std::vector<float> want_bias = y;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) want_bias[m * N + n] += bias[n];

  DeviceBuffer<float> d_y(y), d_x(x), d_bias(bias);
  cuda::add_inplace(d_y.get(), d_x.get(), M * N, nullptr);
  cuda_sync("add_inplace");
  EXPECT_TRUE(all_bits_equal(d_y.download(), want_add));
  d_y.upload(y);
  cuda::add_bias_rows(d_y.get(), M, N, d_bias.get(), nullptr);
  cuda_sync("add_bias_rows");
  EXPECT_TRUE(all_bits_equal(d_y.download(), want_bias));
}

TEST(CudaModelKernels, Bf16CastsMatchHostBitForBit) {
  SHARDLM_REQUIRE_GPU();
  // Special values, rounding ties both ways, denormals, overflow to inf, NaNs with payloads, then
  // random bit patterns.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                0xffffffffu, 0x7fbfffffu, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u,
                                0x3f808001u, 0x3f817fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x00008000u};
  std::mt19937 rng(81);
  for (int i = 0; i < 100000; ++i) bits.push_back(rng());
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * sizeof(float));
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = f32_to_bf16(x[i]);

  DeviceBuffer<float> d_x(x);
  DeviceBuffer<uint16_t> d_y(x.size());
  cuda::f32_to_bf16(d_x.get(), d_y.get(), static_cast<int64_t>(x.size()), nullptr);
  cuda_sync("f32_to_bf16");
  const std::vector<uint16_t> got = d_y.download();
  EXPECT_TRUE(all_bits_equal(got, want));
  // The special values' results written out, not only the host's: nearest even, ties both ways,
  // overflow to inf, NaNs quiet with sign and top payload (Bf16Cache pins the rule against torch).
  const uint16_t pinned[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7fc0, 0xffff, 0x7fff, 0x0000,
                             0x8080, 0x3f80, 0x3f82, 0x3f81, 0x3f81, 0x7f80, 0xff80, 0x7f80, 0x0000};
  for (size_t i = 0; i < std::size(pinned); ++i) EXPECT_EQ(got[i], pinned[i]) << std::hex << "0x" << bits[i];

  // Every bf16 pattern back to fp32.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> want_f(all.size());
  for (size_t i = 0; i < all.size(); ++i) want_f[i] = bf16_to_f32(all[i]);
  DeviceBuffer<uint16_t> d_all(all);
  DeviceBuffer<float> d_f(all.size());
  cuda::bf16_to_f32(d_all.get(), d_f.get(), static_cast<int64_t>(all.size()), nullptr);
  cuda_sync("bf16_to_f32");
  EXPECT_TRUE(all_bits_equal(d_f.download(), want_f));
}

namespace {

// Tolerance per element: 1e-5 * sum_k |x_k w_k| + 1e-6, in double on the host.
std::vector<double> head_matmul_bound(const std::vector<float>& x, int64_t T, int64_t n_heads, int64_t x_stride,
                                      int64_t head_stride, int64_t K, const std::vector<float>& w, int64_t N) {
  std::vector<double> b(T * n_heads * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += std::fabs(static_cast<double>(x[t * x_stride + h * head_stride + k]) * w[(h * N + n) * K + k]);
        b[(t * n_heads + h) * N + n] = 1e-5 * s + 1e-6;
      }
  return b;
}

::testing::AssertionResult within(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::vector<double>& bound) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= bound[i]) && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements off, first [" << first << "] got "
                                       << got[first] << " want " << want[first] << " bound " << bound[first];
}

struct HeadMatmulCase {
  int64_t T, n_heads, x_stride, head_stride, x_offset, K, N;
  const char* what;
};

}  // namespace

TEST(CudaModelKernels, HeadMatmulMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  const int64_t H = 16;
  const std::vector<HeadMatmulCase> cases = {
      // q_nope (first 128 of each head's 192) absorbed into the latent space: K 128 -> N 512.
      {1, H, H * 192, 192, 0, 128, 512, "absorb q, decode"},
      {37, H, H * 192, 192, 0, 128, 512, "absorb q, prefill"},
      // Attention latent output to the value space: packed [T, H, 512], K 512 -> N 128.
      {1, H, H * 512, 512, 0, 512, 128, "latent to value, decode"},
      {45, H, H * 512, 512, 0, 512, 128, "latent to value, prefill"},
      // Odd sizes in every dimension, input at an offset.
      {33, 3, 3 * 100 + 7, 100, 5, 77, 45, "odd"},
  };
  for (const HeadMatmulCase& c : cases) {
    const int64_t x_len = c.x_offset + (c.T - 1) * c.x_stride + (c.n_heads - 1) * c.head_stride + c.K;
    const std::vector<float> x = rand_vec(x_len, 91);
    const std::vector<float> w = rand_vec(c.n_heads * c.N * c.K, 92, -0.2f, 0.2f);
    const std::vector<uint16_t> wb = to_bf16(w);
    std::vector<float> wb_f(wb.size());
    for (size_t i = 0; i < wb.size(); ++i) wb_f[i] = bf16_to_f32(wb[i]);
    const std::vector<float> xs(x.begin() + c.x_offset, x.end());
    const int64_t out = c.T * c.n_heads * c.N;

    std::vector<float> want_f(out), want_b(out);
    cpu::head_matmul_f32w(x.data() + c.x_offset, c.T, c.n_heads, c.x_stride, c.head_stride, c.K, w.data(), c.N,
                          want_f.data());
    cpu::head_matmul_bf16w(x.data() + c.x_offset, c.T, c.n_heads, c.x_stride, c.head_stride, c.K, wb.data(), c.N,
                           want_b.data());

    DeviceBuffer<float> d_x(x), d_w(w), d_y(out);
    DeviceBuffer<uint16_t> d_wb(wb);
    cuda::head_matmul_f32w(d_x.get() + c.x_offset, c.T, c.n_heads, c.x_stride, c.head_stride, c.K, d_w.get(), c.N,
                           d_y.get(), nullptr, nullptr);
    cuda_sync("head_matmul_f32w");
    EXPECT_TRUE(within(d_y.download(), want_f,
                       head_matmul_bound(xs, c.T, c.n_heads, c.x_stride, c.head_stride, c.K, w, c.N)))
        << c.what << ", f32 weights";
    cuda::head_matmul_bf16w(d_x.get() + c.x_offset, c.T, c.n_heads, c.x_stride, c.head_stride, c.K, d_wb.get(), c.N,
                            d_y.get(), nullptr, nullptr);
    cuda_sync("head_matmul_bf16w");
    const std::vector<float> got_b = d_y.download();
    EXPECT_TRUE(within(got_b, want_b, head_matmul_bound(xs, c.T, c.n_heads, c.x_stride, c.head_stride, c.K, wb_f, c.N)))
        << c.what << ", bf16 weights";
    // With a twin (MLA's W_UV product before o_proj): the same output, and its rounding beside it.
    DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(static_cast<size_t>(out), 0xdead));
    cuda::head_matmul_bf16w(d_x.get() + c.x_offset, c.T, c.n_heads, c.x_stride, c.head_stride, c.K, d_wb.get(), c.N,
                            d_y.get(), d_twin.get(), nullptr);
    cuda_sync("head_matmul_bf16w with a twin");
    const std::vector<float> again = d_y.download();
    const std::vector<uint16_t> twin = d_twin.download();
    EXPECT_TRUE(all_bits_equal(again, got_b)) << c.what;
    for (int64_t i = 0; i < out; ++i) ASSERT_EQ(twin[i], f32_to_bf16(again[i])) << c.what << ", twin element " << i;
  }
}
