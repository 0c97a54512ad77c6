// CudaBackend against CpuBackend, op by op, through the ComputeBackend interface the model code
// uses: the cuBLAS GEMM mapping (row-major y = x W^T, fp32 and bf16 weights, bias), the MoE ops,
// the fp8 slice dequantisation at load (bit-identical to the host's, on slices that do not start
// on a block boundary), copies, the single-rank ExpertDispatch bit for bit, and sample() (the same tokens as the host
// Sampler behind CpuBackend::sample, logprobs within 1e-5). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <tuple>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/moe_router.h"
#include "arch/scratch.h"
#include "common/backend_data.h"
#include "backend_ops_fixture.h"
#include "common/gpu.h"
#include "compute/backend.h"
#include "compute/cpu_backend.h"
#include "compute/cuda_backend.h"
#include "core/dtype.h"
#include "engine/sampler.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"
#include "cpu/fp8_act_quant.h"
#include "fp8_bits.h"

namespace shardlm {
namespace {

using test::down;
using test::randn;
using test::up;

TensorView view(const std::string& name, DType dt, std::vector<int64_t> shape, const void* data, size_t nbytes) {
  return test::tensor_view(name, dt, std::move(shape), data, nbytes);
}

// |a - b| <= tol * (sum over the dot product of |x w|), per element of y = x W^T.
void expect_gemm_close(const std::vector<float>& ref, const std::vector<float>& got, double rel, const char* what) {
  ASSERT_EQ(ref.size(), got.size());
  double scale = 0;
  for (float v : ref) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(ref[i], got[i], rel * scale + 1e-6) << what << " element " << i;
}

TEST_F(CudaBackendOps, LinearF32MatchesCpu) {
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 96}, {7, 333, 129}, {128, 1024, 512}}) {
    const auto x = randn(static_cast<size_t>(M * K), 1), w = randn(static_cast<size_t>(N * K), 2, 0.05f);
    const auto bias = randn(static_cast<size_t>(N), 3);
    const TensorView tw = view("w", DType::F32, {N, K}, w.data(), w.size() * 4);
    const TensorView tb = view("b", DType::F32, {N}, bias.data(), bias.size() * 4);
    Matrix wc = cpu_.load_matrix(tw), wg = gpu_->load_matrix(tw);
    Vector bc = cpu_.load_vector(tb), bg = gpu_->load_vector(tb);
    std::vector<float> yc(static_cast<size_t>(M * N));
    cpu_.linear(x.data(), M, wc, &bc, yc.data());
    float* xg = up(*gpu_, x);
    auto* yg = static_cast<float*>(gpu_->alloc(yc.size() * 4));
    gpu_->linear(xg, M, wg, &bg, yg);
    // fp32 SGEMM without TF32: only the summation order differs.
    expect_gemm_close(yc, down(*gpu_, yg, yc.size()), 1e-5, "f32 linear");
  }
}

TEST_F(CudaBackendOps, LinearBf16WithinBf16ActivationRounding) {
  const int64_t M = 33, K = 512, N = 257;
  const auto x = randn(static_cast<size_t>(M * K), 4), wf = randn(static_cast<size_t>(N * K), 5, 0.05f);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  const TensorView tw = view("w", DType::BF16, {N, K}, w.data(), w.size() * 2);
  Matrix wc = cpu_.load_matrix(tw), wg = gpu_->load_matrix(tw);
  std::vector<float> yc(static_cast<size_t>(M * N));
  cpu_.linear(x.data(), M, wc, nullptr, yc.data());
  float* xg = up(*gpu_, x);
  auto* yg = static_cast<float*>(gpu_->alloc(yc.size() * 4));
  gpu_->linear(xg, M, wg, nullptr, yg);
  // The GPU rounds the activations to bf16 (relative 2^-9 each); the error of a K-term sum of
  // such products stays within a few 2^-9 of the largest output.
  expect_gemm_close(yc, down(*gpu_, yg, yc.size()), 1e-2, "bf16 linear");
}

// Random e4m3 codes (no NaN codes: their bits are compared separately) of a [R, C] weight and
// positive scales of its br x bc blocks, with the views the loader would hand over.
struct RandomFp8 {
  std::vector<uint8_t> q;
  std::vector<float> scales;
  TensorView w, s;
};

RandomFp8 random_fp8(int64_t R, int64_t C, int64_t br, int64_t bc, uint32_t seed) {
  RandomFp8 f;
  std::mt19937 g(seed);
  f.q.resize(static_cast<size_t>(R * C));
  for (auto& b : f.q) b = static_cast<uint8_t>(g() & 0xff);
  for (auto& b : f.q)
    if ((b & 0x7f) == 0x7f) b = 0x3c;
  const int64_t sr = (R + br - 1) / br, sc = (C + bc - 1) / bc;
  f.scales = randn(static_cast<size_t>(sr * sc), seed + 1, 0.01f);
  for (float& s : f.scales) s = std::fabs(s) + 1e-4f;
  f.w = view("w", DType::F8_E4M3, {R, C}, f.q.data(), f.q.size());
  f.s = view("w_scale_inv", DType::F32, {sr, sc}, f.scales.data(), f.scales.size() * 4);
  return f;
}

TEST_F(CudaBackendOps, Fp8SliceDequantIsBitIdenticalToHost) {
  const int64_t R = 300, C = 200, br = 128, bc = 64;
  const RandomFp8 f = random_fp8(R, C, br, bc, 7);
  const TensorView& tw = f.w;
  const TensorView& ts = f.s;
  // Whole, a row slice across a block boundary, a column slice off the block grid, and both.
  for (auto [r0, nr, c0, nc] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{0, R, 0, C}, {100, 150, 0, C},
                                {0, R, 37, 100}, {129, 60, 63, 2}}) {
    std::vector<uint16_t> host(static_cast<size_t>(nr * nc));
    dequant_fp8_block(tw, ts, br, bc, r0, nr, c0, nc, host.data());
    const Matrix m = gpu_->load_fp8_matrix(tw, ts, br, bc, r0, nr, c0, nc, /*keep=*/false);
    ASSERT_EQ(m.dtype, DType::BF16);
    ASSERT_EQ(m.rows, nr);
    ASSERT_EQ(m.cols, nc);
    const auto got = down(*gpu_, static_cast<const uint16_t*>(m.data), host.size());
    EXPECT_EQ(std::memcmp(got.data(), host.data(), host.size() * 2), 0)
        << "slice rows " << r0 << "+" << nr << " cols " << c0 << "+" << nc;
  }
}

// A linear weight kept fp8 (load_fp8_matrix with keep) against the same slice dequantised at load:
// the weights are the same bf16 values, so the two linears differ in summation order only, for
// the rows read directly from fp8 (up to 16) and for those that dequantise into a workspace for
// cuBLAS (W8A8 off; these slices are off the 128x128 grid anyway). --fp8-weights bf16
// (set_keep_fp8_weights(false)) loads the bf16 form even with keep.
TEST_F(CudaBackendOps, Fp8KeptLinearMatchesTheDequantisedWeight) {
  const int64_t R = 320, C = 512, br = 128, bc = 128;
  const RandomFp8 f = random_fp8(R, C, br, bc, 11);
  const TensorView& tw = f.w;
  const TensorView& ts = f.s;
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  ASSERT_TRUE(gpu->keeps_fp8_weights());
  gpu->set_fp8_w8a8(false);
  // A row slice (tensor-parallel rows, off the block grid), a column slice on the 16-code grid and
  // one off it (the kernel's two paths).
  for (auto [r0, nr, c0, nc] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{100, 150, 0, C}, {0, R, 128, 256}, {0, 96, 37, 300}}) {
    SCOPED_TRACE(::testing::Message() << "slice rows " << r0 << "+" << nr << " cols " << c0 << "+" << nc);
    const size_t before = gpu->weight_bytes();
    const Matrix kept = gpu_->load_fp8_matrix(tw, ts, br, bc, r0, nr, c0, nc, /*keep=*/true);
    ASSERT_EQ(kept.dtype, DType::F8_E4M3);
    const Fp8SliceScales s = fp8_slice_scales(ts, br, bc, r0, nr, c0, nc);
    // The scale rows padded to 4 columns (cuBLASLt's stride for 128x128 block scales).
    EXPECT_EQ(gpu->weight_bytes() - before,
              static_cast<size_t>(nr * nc) + static_cast<size_t>(s.rows * ((s.cols + 3) / 4 * 4)) * sizeof(float));
    const Matrix bf = gpu_->load_fp8_matrix(tw, ts, br, bc, r0, nr, c0, nc, /*keep=*/false);
    ASSERT_EQ(bf.dtype, DType::BF16);
    for (int64_t M : {1, 5, 16, 17, 70}) {
      const auto x = randn(static_cast<size_t>(M * nc), 13 + static_cast<uint32_t>(M));
      float* xg = up(*gpu_, x);
      auto* y8 = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * nr) * 4));
      auto* yb = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * nr) * 4));
      const int64_t direct = gpu->fp8_direct_linears(), dequant = gpu->fp8_dequant_linears();
      gpu_->linear(xg, M, kept, nullptr, y8);
      EXPECT_EQ(gpu->fp8_direct_linears() - direct, M <= 16 ? 1 : 0) << "M = " << M;
      EXPECT_EQ(gpu->fp8_dequant_linears() - dequant, M <= 16 ? 0 : 1) << "M = " << M;
      gpu_->linear(xg, M, bf, nullptr, yb);
      expect_gemm_close(down(*gpu_, yb, static_cast<size_t>(M * nr)), down(*gpu_, y8, static_cast<size_t>(M * nr)),
                        1e-5, "fp8 kept against bf16");
      for (void* p : {static_cast<void*>(xg), static_cast<void*>(y8), static_cast<void*>(yb)}) gpu_->free(p);
    }
  }
  gpu->set_keep_fp8_weights(false);
  EXPECT_EQ(gpu_->load_fp8_matrix(tw, ts, br, bc, 0, R, 0, C, /*keep=*/true).dtype, DType::BF16);
}

// W8A8: past 16 rows a linear on a weight kept fp8 quantises the activations per row and 128
// features (cpu::fp8_act_quant) and runs cuBLASLt's block-scaled fp8 GEMM; its rows must equal
// the block-scaled sum of the code products computed here in double, to fp32 accumulation. Rows
// past the last multiple of 4 go through the direct fp8 kernel (the bf16-weight result). A K of
// 384 has 3 scale blocks a row, padded to 4 at load. Off the 128x128 grid, or with W8A8 off, the
// weight is dequantised instead.
TEST_F(CudaBackendOps, Fp8PrefillLinearRunsW8A8) {
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  ASSERT_TRUE(gpu->fp8_w8a8());
  for (auto [R, C] : {std::pair<int64_t, int64_t>{320, 512}, {256, 384}}) {
    SCOPED_TRACE(::testing::Message() << "weight " << R << " x " << C);
    const RandomFp8 f = random_fp8(R, C, 128, 128, 21 + static_cast<uint32_t>(C));
    const Matrix kept = gpu_->load_fp8_matrix(f.w, f.s, 128, 128, 0, R, 0, C, /*keep=*/true);
    const Matrix bf = gpu_->load_fp8_matrix(f.w, f.s, 128, 128, 0, R, 0, C, /*keep=*/false);
    const int64_t L = (C + 127) / 128;
    for (int64_t M : {17, 19, 20, 70}) {
      SCOPED_TRACE(::testing::Message() << "M " << M);
      const auto x = randn(static_cast<size_t>(M * C), 31 + static_cast<uint32_t>(M));
      float* xg = up(*gpu_, x);
      auto* y8 = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * R) * 4));
      auto* yb = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * R) * 4));
      const int64_t w8a8 = gpu->fp8_w8a8_linears(), dequant = gpu->fp8_dequant_linears();
      gpu_->linear(xg, M, kept, nullptr, y8);
      EXPECT_TRUE(gpu->fp8_w8a8()) << "the self-check before the first W8A8 GEMM turned it off";
      EXPECT_EQ(gpu->fp8_w8a8_linears() - w8a8, 1);
      EXPECT_EQ(gpu->fp8_dequant_linears() - dequant, 0);
      gpu_->linear(xg, M, bf, nullptr, yb);
      const std::vector<float> got = down(*gpu_, y8, static_cast<size_t>(M * R));
      const std::vector<float> bf_out = down(*gpu_, yb, static_cast<size_t>(M * R));
      const int64_t Mq = M - M % 4;
      std::vector<uint8_t> qx(static_cast<size_t>(Mq * C));
      std::vector<float> sx(static_cast<size_t>(L * Mq));
      cpu::fp8_act_quant(x.data(), Mq, C, qx.data(), sx.data(), Mq);
      double worst = 0, scale = 0;
      for (int64_t m = 0; m < Mq; ++m)
        for (int64_t n = 0; n < R; ++n) {
          double want = 0, mag = 0;
          for (int64_t b = 0; b < L; ++b) {
            double part = 0, part_mag = 0;
            for (int64_t k = b * 128; k < std::min(C, b * 128 + 128); ++k) {
              const double p = static_cast<double>(fp8_bits::to_f32(qx[m * C + k])) * fp8_bits::to_f32(f.q[n * C + k]);
              part += p;
              part_mag += std::fabs(p);
            }
            const double s = static_cast<double>(sx[b * Mq + m]) * f.scales[(n / 128) * L + b];
            want += part * s;
            mag += part_mag * s;
          }
          worst = std::max(worst, std::fabs(got[m * R + n] - want) / (mag + 1e-30));
          scale = std::max(scale, std::fabs(want));
        }
      // Relative to the sum of the magnitudes: fp32 in the emulation; Hopper's fp8 tensor cores keep
      // about 14 bits within a 128-feature block before cuBLASLt scales it into fp32. Measured on an
      // H200: up to 3.3e-4 (M 17, K 384); a misread scale or layout is off by O(1).
      EXPECT_LT(worst, 1e-3) << "W8A8 rows against the block-scaled sum in double";
      // The rows past Mq: the direct kernel's, the dequantised weight's to summation order.
      std::vector<float> tail_got(got.begin() + Mq * R, got.end()), tail_bf(bf_out.begin() + Mq * R, bf_out.end());
      if (!tail_bf.empty()) expect_gemm_close(tail_bf, tail_got, 1e-5, "rows past the multiple of 4");
      // And the whole against unquantised activations: within e4m3's rounding of them.
      expect_gemm_close(bf_out, got, 0.08, "W8A8 against the bf16 path");
      for (void* p : {static_cast<void*>(xg), static_cast<void*>(y8), static_cast<void*>(yb)}) gpu_->free(p);
    }
  }
  // Off the grid (a row slice from row 100), and W8A8 off: the weight is dequantised.
  const RandomFp8 f = random_fp8(320, 512, 128, 128, 5);
  const int64_t M = 32;
  const auto x = randn(static_cast<size_t>(M * 512), 9);
  float* xg = up(*gpu_, x);
  auto* y = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * 320) * 4));
  const Matrix off = gpu_->load_fp8_matrix(f.w, f.s, 128, 128, 100, 200, 0, 512, /*keep=*/true);
  const Matrix on = gpu_->load_fp8_matrix(f.w, f.s, 128, 128, 0, 320, 0, 512, /*keep=*/true);
  int64_t w8a8 = gpu->fp8_w8a8_linears(), dequant = gpu->fp8_dequant_linears();
  gpu_->linear(xg, M, off, nullptr, y);
  EXPECT_EQ(gpu->fp8_w8a8_linears() - w8a8, 0);
  EXPECT_EQ(gpu->fp8_dequant_linears() - dequant, 1);
  gpu->set_fp8_w8a8(false);
  w8a8 = gpu->fp8_w8a8_linears();
  gpu_->linear(xg, M, on, nullptr, y);
  EXPECT_EQ(gpu->fp8_w8a8_linears() - w8a8, 0);
  EXPECT_EQ(gpu->fp8_dequant_linears() - dequant, 2);
  gpu_->free(xg);
  gpu_->free(y);
}

// A W8A8 linear inside a CUDA graph (a decode bucket past 16 rows on fp8 weights): run eagerly once
// (plan and workspaces), captured, then replayed on new activations, it gives the eager bits.
TEST_F(CudaBackendOps, Fp8W8A8LinearReplaysInAGraph) {
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  const RandomFp8 f = random_fp8(256, 512, 128, 128, 13);
  const Matrix kept = gpu_->load_fp8_matrix(f.w, f.s, 128, 128, 0, 256, 0, 512, /*keep=*/true);
  const int64_t M = 34;  // 32 rows W8A8, 2 through the direct kernel
  const auto x1 = randn(static_cast<size_t>(M * 512), 14), x2 = randn(static_cast<size_t>(M * 512), 15);
  float* xg = up(*gpu_, x1);
  auto* y = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * 256) * 4));
  auto* want = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * 256) * 4));
  const int64_t w8a8 = gpu->fp8_w8a8_linears();
  gpu_->linear(xg, M, kept, nullptr, y);  // eager: the plan and the workspaces
  gpu_->begin_capture();
  gpu_->linear(xg, M, kept, nullptr, y);
  const int64_t graph = gpu_->end_capture();
  for (const auto* x : {&x2, &x1}) {
    gpu_->copy_to_device(xg, x->data(), x->size() * sizeof(float));
    gpu_->replay(graph);
    gpu_->linear(xg, M, kept, nullptr, want);
    const std::vector<float> got = down(*gpu_, y, static_cast<size_t>(M * 256));
    const std::vector<float> ref = down(*gpu_, want, static_cast<size_t>(M * 256));
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(gpu->fp8_w8a8_linears() - w8a8, 4);  // eager, captured, and the two references
  gpu_->drop_captures();
  for (void* p : {static_cast<void*>(xg), static_cast<void*>(y), static_cast<void*>(want)}) gpu_->free(p);
}

// Before its first W8A8 GEMM the backend checks cuBLASLt against the direct fp8 kernel on a
// problem both compute exactly; a cuBLASLt that reads the activation scales in another layout
// (the emulation's SHARDLM_EMU_CUBLASLT_ROW_MAJOR_VEC128) must turn W8A8 off, and the linear must
// still give the dequantised weight's result.
TEST_F(CudaBackendOps, Fp8PrefillTurnsW8A8OffWhenCuBlasLtDisagrees) {
#ifndef SHARDLM_CUDA_EMULATION
  GTEST_SKIP() << "needs the emulated cuBLASLt's misreading switch";
#else
  struct Env {
    Env() { setenv("SHARDLM_EMU_CUBLASLT_ROW_MAJOR_VEC128", "1", 1); }
    ~Env() { unsetenv("SHARDLM_EMU_CUBLASLT_ROW_MAJOR_VEC128"); }
  } env;
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  const RandomFp8 f = random_fp8(320, 512, 128, 128, 8);
  const Matrix kept = gpu_->load_fp8_matrix(f.w, f.s, 128, 128, 0, 320, 0, 512, /*keep=*/true);
  const Matrix bf = gpu_->load_fp8_matrix(f.w, f.s, 128, 128, 0, 320, 0, 512, /*keep=*/false);
  const int64_t M = 32;
  const auto x = randn(static_cast<size_t>(M * 512), 12);
  float* xg = up(*gpu_, x);
  auto* y8 = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * 320) * 4));
  auto* yb = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * 320) * 4));
  gpu_->linear(xg, M, kept, nullptr, y8);
  EXPECT_FALSE(gpu->fp8_w8a8());
  EXPECT_EQ(gpu->fp8_w8a8_linears(), 0);
  EXPECT_EQ(gpu->fp8_dequant_linears(), 1);
  gpu_->linear(xg, M, bf, nullptr, yb);
  expect_gemm_close(down(*gpu_, yb, static_cast<size_t>(M * 320)), down(*gpu_, y8, static_cast<size_t>(M * 320)), 1e-5,
                    "fallback after the self-check");
  // The verdict stands: asking for W8A8 again (as shardlm bench does) runs no block-scaled GEMM.
  gpu->set_fp8_w8a8(true);
  gpu_->linear(xg, M, kept, nullptr, y8);
  EXPECT_FALSE(gpu->fp8_w8a8());
  EXPECT_EQ(gpu->fp8_w8a8_linears(), 0);
  EXPECT_EQ(gpu->fp8_dequant_linears(), 2);
  for (void* p : {static_cast<void*>(xg), static_cast<void*>(y8), static_cast<void*>(yb)}) gpu_->free(p);
#endif
}

// The grouped W8A8 kernel runs the same self-check problem (as two groups of one weight) before
// its first use; a tensor core whose fragments it misreads (the emulation's
// SHARDLM_EMU_MMA_FP8_SWAPPED_K) must turn it off alone: W8A8 stays on, and the experts' larger
// groups run as one cuBLASLt GEMM each, as --fp8-expert-gemm per-expert gives them.
TEST_F(CudaBackendOps, Fp8GroupedGemmTurnsOffWhenItsFragmentsMisread) {
#ifndef SHARDLM_CUDA_EMULATION
  GTEST_SKIP() << "needs the emulated tensor core's misreading switch";
#else
  struct Env {
    Env() { setenv("SHARDLM_EMU_MMA_FP8_SWAPPED_K", "1", 1); }
    ~Env() { unsetenv("SHARDLM_EMU_MMA_FP8_SWAPPED_K"); }
  } env;
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  const RandomFp8 f1 = random_fp8(128, 256, 128, 128, 21), f2 = random_fp8(128, 256, 128, 128, 22);
  const Matrix w1 = gpu_->load_fp8_matrix(f1.w, f1.s, 128, 128, 0, 128, 0, 256, /*keep=*/true);
  const Matrix w2 = gpu_->load_fp8_matrix(f2.w, f2.s, 128, 128, 0, 128, 0, 256, /*keep=*/true);
  const std::vector<int64_t> offsets = {0, 20, 44};
  const auto x = randn(static_cast<size_t>(44 * 256), 23);
  float* xg = up(*gpu_, x);
  auto* y = static_cast<float*>(gpu_->alloc(static_cast<size_t>(44 * 128) * 4));
  auto* want = static_cast<float*>(gpu_->alloc(static_cast<size_t>(44 * 128) * 4));
  EXPECT_TRUE(gpu->fp8_grouped_gemm());
  gpu_->grouped_linear(xg, offsets, {&w1, &w2}, y);
  EXPECT_FALSE(gpu->fp8_grouped_gemm());
  EXPECT_TRUE(gpu->fp8_w8a8());
  EXPECT_EQ(gpu->fp8_grouped_gemm_launches(), 0);
  EXPECT_EQ(gpu->fp8_w8a8_linears(), 2);
  // The per-expert GEMMs' bits: each group alone over its rows (both multiples of 4).
  gpu_->linear(xg, 20, w1, nullptr, want);
  gpu_->linear(xg + 20 * 256, 24, w2, nullptr, want + 20 * 128);
  const std::vector<float> got = down(*gpu_, y, 44 * 128), ref = down(*gpu_, want, 44 * 128);
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0);
  // The verdict stands when grouping is asked for again.
  gpu->set_fp8_grouped_gemm(true);
  gpu_->grouped_linear(xg, offsets, {&w1, &w2}, y);
  EXPECT_EQ(gpu->fp8_grouped_gemm_launches(), 0);
  for (void* p : {static_cast<void*>(xg), static_cast<void*>(y), static_cast<void*>(want)}) gpu_->free(p);
#endif
}

TEST_F(CudaBackendOps, MoeOpsMatchCpu) {
  const int64_t T = 37, H = 96, E = 16, k = 4;
  const auto logits = randn(static_cast<size_t>(T * E), 9), x = randn(static_cast<size_t>(T * H), 10);
  const auto bias = randn(static_cast<size_t>(E), 11, 0.1f);
  for (bool sigmoid : {false, true}) {
    RouterConfig cfg;
    cfg.num_experts = E;
    cfg.k = k;
    cfg.sigmoid = sigmoid;
    cfg.renormalise = !sigmoid;
    cfg.norm_topk_prob = sigmoid;
    cfg.scale = sigmoid ? 2.5 : 1.0;
    cfg.n_group = sigmoid ? 4 : 1;
    cfg.topk_group = sigmoid ? 2 : 1;
    std::vector<int32_t> ids_c(static_cast<size_t>(T * k));
    std::vector<float> w_c(ids_c.size());
    RouterConfig cfg_c = cfg, cfg_g = cfg;
    cfg_c.bias = sigmoid ? bias.data() : nullptr;
    float* bias_g = up(*gpu_, bias);
    cfg_g.bias = sigmoid ? bias_g : nullptr;
    cpu_.moe_route(logits.data(), T, cfg_c, ids_c.data(), w_c.data());
    float* lg = up(*gpu_, logits);
    auto* ids_g = static_cast<int32_t*>(gpu_->alloc(ids_c.size() * 4));
    auto* w_g = static_cast<float*>(gpu_->alloc(w_c.size() * 4));
    gpu_->moe_route(lg, T, cfg_g, ids_g, w_g);
    EXPECT_EQ(down(*gpu_, ids_g, ids_c.size()), ids_c) << (sigmoid ? "sigmoid" : "softmax");
    const auto wg = down(*gpu_, w_g, w_c.size());
    for (size_t i = 0; i < w_c.size(); ++i) EXPECT_NEAR(wg[i], w_c[i], 1e-6 * std::fabs(w_c[i]) + 1e-7);

    // Local experts [4, 12) of 16: permute, gather, a stand-in expert (y = 2x), combine, gated add.
    const int64_t e0 = 4, El = 8;
    std::vector<int32_t> off_c(static_cast<size_t>(El + 1)), slot_c(ids_c.size()), pair_c(ids_c.size());
    cpu_.expert_permute(ids_c.data(), T, k, e0, El, nullptr, off_c.data(), slot_c.data(), pair_c.data(), nullptr);
    auto* off_g = static_cast<int32_t*>(gpu_->alloc(off_c.size() * 4));
    auto* slot_g = static_cast<int32_t*>(gpu_->alloc(slot_c.size() * 4));
    auto* pair_g = static_cast<int32_t*>(gpu_->alloc(pair_c.size() * 4));
    int32_t* ids_in = up(*gpu_, ids_c);  // the same routing on both sides
    float* w_in = up(*gpu_, w_c);
    gpu_->expert_permute(ids_in, T, k, e0, El, nullptr, off_g, slot_g, pair_g, nullptr);
    ASSERT_EQ(down(*gpu_, off_g, off_c.size()), off_c);
    EXPECT_EQ(down(*gpu_, slot_g, slot_c.size()), slot_c);
    const int64_t rows = off_c[El];
    pair_c.resize(static_cast<size_t>(rows));
    EXPECT_EQ(down(*gpu_, pair_g, static_cast<size_t>(rows)), pair_c);
    std::vector<float> xp_c(static_cast<size_t>(rows * H));
    cpu_.expert_gather(x.data(), H, k, pair_c.data(), off_c.data() + El, rows, xp_c.data());
    float* xg = up(*gpu_, x);
    auto* xp_g = static_cast<float*>(gpu_->alloc(std::max<size_t>(xp_c.size(), 1) * 4));
    gpu_->expert_gather(xg, H, k, pair_g, off_g + El, T * k, xp_g);
    EXPECT_EQ(down(*gpu_, xp_g, xp_c.size()), xp_c);
    for (float& v : xp_c) v *= 2.0f;
    float* yp_g = up(*gpu_, xp_c);
    std::vector<float> out_c(static_cast<size_t>(T * H));
    cpu_.expert_combine(xp_c.data(), H, ids_c.data(), w_c.data(), slot_c.data(), T, k, out_c.data());
    auto* out_g = static_cast<float*>(gpu_->alloc(out_c.size() * 4));
    gpu_->expert_combine(yp_g, H, ids_in, w_in, slot_g, T, k, out_g);
    EXPECT_EQ(down(*gpu_, out_g, out_c.size()), out_c);
    const auto gate = randn(static_cast<size_t>(T), 12);
    float* gate_g = up(*gpu_, gate);
    cpu_.gated_add(out_c.data(), x.data(), gate.data(), T, H);
    gpu_->gated_add(out_g, xg, gate_g, T, H);
    const auto og = down(*gpu_, out_g, out_c.size());
    for (size_t i = 0; i < og.size(); ++i) EXPECT_NEAR(og[i], out_c[i], 1e-6 * (std::fabs(out_c[i]) + 1));
  }
}

// The largest magnitude folded into a running maximum: the CPU's value (a maximum does not round),
// over sizes below one block, across the grid-stride loop (more than 1024 blocks of 256), with a
// negative extreme planted last and a NaN (skipped), and folding into what the accumulator held.
TEST_F(CudaBackendOps, AbsMaxMatchesCpu) {
  std::mt19937 g(31);
  float* acc_g = up(*gpu_, std::vector<float>{0.0f});
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{257}, int64_t{100003}, int64_t{300001}}) {
    for (const float start : {0.0f, 0.5f, 1e6f}) {
      auto x = randn(static_cast<size_t>(n), static_cast<uint32_t>(32 + n));
      if (n > 2) {
        x[static_cast<size_t>(n - 1)] = -37.25f;  // past the first pass of the grid-stride loop
        x[static_cast<size_t>(g() % (n - 1))] = std::nanf("");
      }
      float acc_c = start;
      cpu_.abs_max(x.data(), n, &acc_c);
      gpu_->copy_to_device(acc_g, &start, sizeof start);
      gpu_->abs_max(up(*gpu_, x), n, acc_g);
      const float got = down(*gpu_, acc_g, 1)[0];
      EXPECT_EQ(std::memcmp(&got, &acc_c, sizeof got), 0)
          << "n " << n << " from " << start << ": " << got << " vs " << acc_c;
      if (n > 2 && start < 37.25f) {
        EXPECT_EQ(acc_c, 37.25f) << n;
      }
    }
  }
}

// The single-rank ExpertDispatch on each backend: the same gathered input and, from the same
// expert results, the same combined bits (into a larger output: rows outside the tokens zero).
TEST_F(CudaBackendOps, ExpertDispatchMatchesCpu) {
  const int64_t T = 29, E = 8, k = 3, H = 80, first = 2, out_rows = T + 4;
  const auto logits = randn(static_cast<size_t>(T * E), 24), x = randn(static_cast<size_t>(T * H), 25);
  Routing r;
  route_softmax_topk(logits.data(), T, E, k, true, 1.0, &r);
  const auto y = randn(static_cast<size_t>(T * k * H), 26);

  Scratch sc(cpu_);
  ExpertDispatch dc(nullptr, E, H);
  dc.dispatch(sc, x.data(), r);
  ASSERT_EQ(dc.rows(), T * k);
  const std::vector<float> in_c(dc.input().f32, dc.input().f32 + T * k * H);
  EXPECT_EQ(dc.input().bf16, nullptr);  // the CPU wants no twins
  std::copy(y.begin(), y.end(), dc.output());
  std::vector<float> out_c(static_cast<size_t>(out_rows * H), 3.0f);
  dc.combine(sc, out_c.data(), out_rows, first);

  Scratch sg(*gpu_);
  ExpertDispatch dg(nullptr, E, H);
  // No twin where the backend wants none (no bf16 or fp8 weight loaded yet), however many rows.
  dg.dispatch(sg, up(*gpu_, x), r, ExpertWire::kF32, T * k);
  EXPECT_EQ(dg.input().bf16, nullptr);
  const uint16_t one = f32_to_bf16(1.0f);
  gpu_->load_matrix(view("w", DType::BF16, {1, 1}, &one, 2));
  ASSERT_TRUE(gpu_->wants_bf16_twins());
  dg.dispatch(sg, up(*gpu_, x), r, ExpertWire::kF32, T * k - 1);  // more rows than asked a twin for
  EXPECT_EQ(dg.input().bf16, nullptr);
  dg.dispatch(sg, up(*gpu_, x), r, ExpertWire::kF32, T * k);
  ASSERT_EQ(dg.offsets(), dc.offsets());
  EXPECT_EQ(down(*gpu_, dg.input().f32, in_c.size()), in_c);
  ASSERT_NE(dg.input().bf16, nullptr);
  const std::vector<uint16_t> twin = down(*gpu_, dg.input().bf16, in_c.size());
  size_t twin_differ = 0;
  for (size_t i = 0; i < in_c.size(); ++i) twin_differ += twin[i] != f32_to_bf16(in_c[i]);
  EXPECT_EQ(twin_differ, 0u);
  gpu_->copy_to_device(dg.output(), y.data(), y.size() * sizeof(float));
  float* out_g = up(*gpu_, std::vector<float>(out_c.size(), 3.0f));
  dg.combine(sg, out_g, out_rows, first);
  const auto og = down(*gpu_, out_g, out_c.size());
  size_t differ = 0;
  for (size_t i = 0; i < og.size(); ++i) differ += std::memcmp(&og[i], &out_c[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u);
}

// Rows of LM-head-like logits (a normal body and a few strong tokens) with mixed settings: greedy,
// temperature alone, top-k, top-p, min-p and combinations, seeds and positions varied per row, and
// vLLM's penalties on every other row (on seen tokens that include the strong ones, so that they
// change choices: the count of changed rows is checked against the same rows without them), some
// with logit biases, some keeping only their allowed tokens.
void check_sample(ComputeBackend& cpu, ComputeBackend& gpu, int64_t R, int64_t V, uint32_t seed) {
  std::vector<float> logits = randn(static_cast<size_t>(R * V), seed, 2.5f);
  std::mt19937_64 gen(seed * 31u + 7);
  std::vector<std::vector<int32_t>> strong(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    for (int i = 0; i < 5; ++i) {
      const int32_t t = static_cast<int32_t>(gen() % V);
      logits[r * V + t] += 8.0f + static_cast<float>(i);
      strong[r].push_back(t);
    }
  }
  const SampleRow settings[] = {
      {0.0, 1.0, 0.0, 0, 0, 0},    {1.0, 1.0, 0.0, 0, 0, 0},   {0.7, 0.9, 0.0, 0, 0, 0},
      {1.3, 1.0, 0.0, 50, 0, 0},   {0.6, 1.0, 0.05, 0, 0, 0},  {1.0, 0.95, 0.02, 64, 0, 0},
      {0.0, 0.9, 0.1, 40, 0, 0},   {2.0, 0.99, 0.0, 0, 0, 0},  {1.0, 1.0, 0.0, 1, 0, 0},
  };
  struct Penalties {
    float repetition, frequency, presence;
  };
  const Penalties penalties[] = {
      {3.0f, 0.0f, 0.0f}, {1.0f, 2.0f, 0.0f}, {1.0f, 0.0f, 2.0f}, {2.2f, 1.4f, 1.6f}, {0.8f, -0.5f, -1.0f}};
  std::vector<SampleRow> rows(static_cast<size_t>(R));
  std::vector<TokenEdit> seen;
  for (int64_t r = 0; r < R; ++r) {
    rows[r] = settings[static_cast<size_t>(r) % std::size(settings)];
    rows[r].seed = gen();
    rows[r].position = static_cast<int64_t>(gen() % 100000);
    if (r % 2 == 1) {
      const Penalties& p = penalties[static_cast<size_t>(r / 2) % std::size(penalties)];
      rows[r].repetition_penalty = p.repetition;
      rows[r].frequency_penalty = p.frequency;
      rows[r].presence_penalty = p.presence;
      rows[r].edits_begin = static_cast<int64_t>(seen.size());
      std::vector<int32_t> tokens = strong[r];
      for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<int32_t>(gen() % V));
      std::sort(tokens.begin(), tokens.end());
      tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
      for (int32_t t : tokens) seen.push_back({t, static_cast<int32_t>(gen() % 4)});  // 0: the prompt only
      // vLLM's logit controls on some of these rows: biases (-inf: a stop token before min_tokens),
      // unseen biased tokens, and rows that keep only their allowed tokens.
      const float biases[] = {0.0f, 2.0f, -1.5f, -INFINITY, 5.0f};
      for (int i = 0; i < 6; ++i) {
        const auto t = static_cast<int32_t>(gen() % V);
        if (!std::binary_search(tokens.begin(), tokens.end(), t) &&
            std::none_of(seen.begin() + rows[r].edits_begin, seen.end(),
                         [t](const TokenEdit& e) { return e.token == t; }))
          seen.push_back({t, -1, 3.0f, 0});
      }
      rows[r].allowed_only = r % 6 == 1;
      for (auto e = seen.begin() + rows[r].edits_begin; e != seen.end(); ++e) {
        if (r % 4 == 3) e->bias += biases[gen() % std::size(biases)];
        e->allowed = static_cast<int32_t>(gen() % 2);
      }
      rows[r].edits_count = static_cast<int64_t>(seen.size()) - rows[r].edits_begin;
    }
  }
  // Every third row is scored on a given token (prompt logprobs); rows ask for 0 to 20 top
  // alternatives, and some rows hold their strongest logit twice (the tie goes to the lower id).
  int64_t top = 0;
  for (int64_t r = 0; r < R; ++r) {
    if (r % 3 == 2) rows[r].target = static_cast<int32_t>(gen() % V);
    rows[r].top_n = static_cast<int32_t>((r * 7) % (kMaxTopLogprobs + 1));
    rows[r].top_begin = top;
    top += rows[r].top_n;
    if (r % 4 == 0) logits[r * V + (strong[r][4] + 1) % V] = logits[r * V + strong[r][4]];
  }
  std::vector<int32_t> tok_c(static_cast<size_t>(R)), tok_g(static_cast<size_t>(R), -1);
  std::vector<float> lp_c(static_cast<size_t>(R)), lp_g(static_cast<size_t>(R));
  std::vector<int32_t> top_c(static_cast<size_t>(top)), top_g(static_cast<size_t>(top), -2);
  std::vector<float> top_lp_c(static_cast<size_t>(top)), top_lp_g(static_cast<size_t>(top));
  cpu.sample(logits.data(), R, V, rows.data(), seen.data(), tok_c.data(), lp_c.data(), top_c.data(), top_lp_c.data());
  const float* d_logits = up(gpu, logits);
  gpu.sample(d_logits, R, V, rows.data(), seen.data(), tok_g.data(), lp_g.data(), top_g.data(), top_lp_g.data());
  for (int64_t r = 0; r < R; ++r) {
    if (rows[r].target >= 0) {
      EXPECT_EQ(tok_c[r], rows[r].target) << "row " << r;
    }
    std::vector<float> sorted(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    for (int32_t k = 0; k < rows[r].top_n; ++k) {
      const size_t at = static_cast<size_t>(rows[r].top_begin + k);
      ASSERT_EQ(top_g[at], top_c[at]) << "V " << V << " row " << r << " alternative " << k;
      ASSERT_NEAR(top_lp_g[at], top_lp_c[at], 1e-5 * std::max(1.0f, std::fabs(top_lp_c[at]))) << "row " << r;
      // The host's are the k-th largest logit's, and the logprob of that token.
      ASSERT_EQ(logits[r * V + top_c[at]], sorted[static_cast<size_t>(k)]) << "row " << r << " alternative " << k;
      ASSERT_EQ(top_lp_c[at], log_softmax_at(logits.data() + r * V, V, top_c[at])) << "row " << r;
      if (k > 0 && sorted[static_cast<size_t>(k)] == sorted[static_cast<size_t>(k) - 1]) {
        ASSERT_GT(top_c[at], top_c[at - 1]) << "a tie goes to the lower id first";
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const SampleRow& p = rows[r];
    ASSERT_EQ(tok_g[r], tok_c[r]) << "V " << V << " row " << r << " T " << p.temperature << " top_k " << p.top_k
                                  << " top_p " << p.top_p << " min_p " << p.min_p << " edited " << p.edited();
    ASSERT_NEAR(lp_g[r], lp_c[r], 1e-5 * std::max(1.0f, std::fabs(lp_c[r]))) << "V " << V << " row " << r;
    // The logprob is the raw row's, penalties or not.
    ASSERT_NEAR(lp_c[r], log_softmax_at(logits.data() + r * V, V, tok_c[r]), 1e-6) << "row " << r;
  }
  // The same rows without penalties: many penalized rows choose otherwise (their strong tokens are
  // penalized), so the penalties were applied on both sides.
  std::vector<SampleRow> plain = rows;
  for (SampleRow& p : plain) p.edits_count = 0, p.allowed_only = false;
  std::vector<int32_t> tok_plain(static_cast<size_t>(R));
  std::vector<float> lp_plain(static_cast<size_t>(R));
  cpu.sample(logits.data(), R, V, plain.data(), nullptr, tok_plain.data(), lp_plain.data(), top_c.data(),
             top_lp_c.data());
  int64_t changed = 0;
  for (int64_t r = 1; r < R; r += 2) changed += rows[r].target < 0 && tok_plain[r] != tok_c[r];
  EXPECT_GE(changed, (R / 3) / 6) << "of " << R / 2 << " penalized rows";
}

TEST_F(CudaBackendOps, SampleMatchesCpu) {
  for (uint32_t seed = 40; seed < 44; ++seed) check_sample(cpu_, *gpu_, 72, 1000, seed);
  check_sample(cpu_, *gpu_, 3, 1000, 50);  // fewer rows after more: the buffers are reused
  check_sample(cpu_, *gpu_, 27, 151936, 51);
  // No rows: nothing to do, nothing written.
  int32_t tok = -1;
  float lp = 1.0f;
  gpu_->sample(nullptr, 0, 151936, nullptr, nullptr, &tok, &lp, nullptr, nullptr);
  EXPECT_EQ(tok, -1);
  EXPECT_EQ(lp, 1.0f);
}

}  // namespace
}  // namespace shardlm
