// The bf16 twins of activations (compute/backend.h Activations) on the CUDA backend: rmsnorm
// writes one next to its fp32 output, and a linear whose GEMM reads bf16 activations (bf16
// weights, fp8 ones within the direct rows, stacked or apart in linear_parts) takes it in place
// of its f32_to_bf16 launch. Every result is memcmp-equal to the same call without the twin; the
// casts spared are read off activation_casts() / twin_reads(), and in a captured step off its
// node count. Skips without a GPU (and runs on the emulated runtime).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend_ops_fixture.h"
#include "common/backend_data.h"
#include "compute/backend.h"
#include "compute/cuda_backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"

namespace shardlm {
namespace {

using test::down;
using test::randn;
using test::up;

constexpr int64_t kK = 256;  // two 128-column fp8 blocks
constexpr float kEps = 1e-6f;

class CudaActivationTwins : public CudaBackendOps {
 protected:
  CudaBackend& gpu() { return *dynamic_cast<CudaBackend*>(gpu_.get()); }

  Matrix bf16_weight(int64_t N, uint32_t seed) {
    const auto f = randn(static_cast<size_t>(N * kK), seed, 0.05f);
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
    return gpu_->load_matrix(test::tensor_view("w", DType::BF16, {N, kK}, b.data(), b.size() * 2));
  }
  Matrix f32_weight(int64_t N, uint32_t seed) {
    const auto f = randn(static_cast<size_t>(N * kK), seed, 0.05f);
    return gpu_->load_matrix(test::tensor_view("w", DType::F32, {N, kK}, f.data(), f.size() * 4));
  }
  Matrix fp8_weight(int64_t N, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<uint8_t> q(static_cast<size_t>(N * kK));
    for (auto& c : q) {
      c = static_cast<uint8_t>(g() & 0xff);
      if ((c & 0x7f) == 0x7f) c = 0x3c;  // no NaN codes
    }
    auto s = randn(static_cast<size_t>(((N + 127) / 128) * (kK / 128)), seed + 1, 0.01f);
    for (float& v : s) v = std::fabs(v) + 1e-4f;
    const TensorView w = test::tensor_view("w", DType::F8_E4M3, {N, kK}, q.data(), q.size());
    const TensorView sv =
        test::tensor_view("w_scale_inv", DType::F32, {(N + 127) / 128, kK / 128}, s.data(), s.size() * 4);
    return gpu_->load_fp8_matrix(w, sv, 128, 128, 0, N, 0, kK, /*keep=*/true);
  }

  // M normed rows on the device: their fp32 form and their twin, written by one rmsnorm.
  struct Normed {
    float* f32;
    uint16_t* bf16;
  };
  Normed normed(int64_t M, uint32_t seed) {
    float* x = up(*gpu_, randn(static_cast<size_t>(M * kK), seed));
    const auto g = randn(static_cast<size_t>(kK), seed + 1, 0.2f);
    std::vector<float> scale(g.size());
    for (size_t i = 0; i < g.size(); ++i) scale[i] = 1.0f + g[i];
    norm_ = gpu_->load_vector(test::tensor_view("g", DType::F32, {kK}, scale.data(), scale.size() * 4));
    Normed n{static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * kK) * 4)),
             static_cast<uint16_t*>(gpu_->alloc(static_cast<size_t>(M * kK) * 2))};
    gpu_->rmsnorm(x, norm_, M, kEps, {n.f32, n.bf16});
    gpu_->free(x);
    return n;
  }

  // `call` on the rows without their twin and with it: the same bits, and the casts each ran.
  struct Ran {
    int64_t casts_plain, casts_twin, reads_twin;
  };
  Ran compare(const Normed& x, size_t out_floats, const std::function<void(Activations, float*)>& call,
              const std::string& what) {
    auto* plain = static_cast<float*>(gpu_->alloc(out_floats * 4));
    auto* twin = static_cast<float*>(gpu_->alloc(out_floats * 4));
    Ran r{};
    int64_t casts = gpu().activation_casts(), reads = gpu().twin_reads();
    call(x.f32, plain);
    r.casts_plain = gpu().activation_casts() - casts;
    EXPECT_EQ(gpu().twin_reads(), reads) << what;
    casts = gpu().activation_casts();
    call(Activations{x.f32, x.bf16}, twin);
    r.casts_twin = gpu().activation_casts() - casts;
    r.reads_twin = gpu().twin_reads() - reads;
    const auto a = down(*gpu_, plain, out_floats), b = down(*gpu_, twin, out_floats);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), out_floats * 4)) << what << ": the twin changed the result";
    gpu_->free(plain);
    gpu_->free(twin);
    return r;
  }

  void release(const Normed& n) {
    gpu_->free(n.f32);
    gpu_->free(n.bf16);
  }

  Vector norm_;  // the last normed() call's scales
};

// Asked for once a weight that reads bf16 activations is loaded; fp32 weights' SGEMM does not.
TEST_F(CudaActivationTwins, WantedOnceLowPrecisionWeightsAreLoaded) {
  EXPECT_FALSE(gpu_->wants_bf16_twins());
  f32_weight(8, 1);
  EXPECT_FALSE(gpu_->wants_bf16_twins());
  bf16_weight(8, 2);
  EXPECT_TRUE(gpu_->wants_bf16_twins());
  auto other = make_backend("cuda");
  other->load_fp8_matrix(
      test::tensor_view("w", DType::F8_E4M3, {128, 128}, std::vector<uint8_t>(128 * 128).data(), 128 * 128),
      test::tensor_view("s", DType::F32, {1, 1}, std::vector<float>{1.0f}.data(), 4), 128, 128, 0, 128, 0, 128, true);
  EXPECT_TRUE(other->wants_bf16_twins());
}

TEST_F(CudaActivationTwins, LinearReadsTheTwinInsteadOfCasting) {
  const Matrix wb = bf16_weight(48, 11), w8 = fp8_weight(160, 12), w32 = f32_weight(24, 13);
  const auto bias_h = randn(48, 14);
  const Vector bias = gpu_->load_vector(test::tensor_view("b", DType::F32, {48}, bias_h.data(), bias_h.size() * 4));
  for (int64_t M : {1, 5, 40}) {
    SCOPED_TRACE(::testing::Message() << "M = " << M);
    const Normed x = normed(M, 20 + static_cast<uint32_t>(M));
    Ran r = compare(
        x, static_cast<size_t>(M * 48), [&](Activations a, float* y) { gpu_->linear(a, M, wb, &bias, y); }, "bf16");
    EXPECT_EQ(r.casts_plain, 1);
    EXPECT_EQ(r.casts_twin, 0);
    EXPECT_EQ(r.reads_twin, 1);
    // fp8: the direct kernel reads bf16 rows (M <= 16); past it W8A8 quantises the fp32 rows (or,
    // where it declines, the dequantised weight's GEMM reads bf16 ones): the same bits either way.
    r = compare(
        x, static_cast<size_t>(M * 160), [&](Activations a, float* y) { gpu_->linear(a, M, w8, nullptr, y); }, "fp8");
    if (M <= 16) {
      EXPECT_EQ(r.casts_plain, 1);
      EXPECT_EQ(r.casts_twin, 0);
      EXPECT_EQ(r.reads_twin, 1);
    }
    r = compare(
        x, static_cast<size_t>(M * 24), [&](Activations a, float* y) { gpu_->linear(a, M, w32, nullptr, y); }, "f32");
    EXPECT_EQ(r.casts_plain, 0);
    EXPECT_EQ(r.reads_twin, 0);
    release(x);
  }
}

// linear_parts: parts apart share the twin as they share a cast; stacked ones pass it to their
// one linear.
TEST_F(CudaActivationTwins, LinearPartsReadTheTwin) {
  std::vector<Matrix> apart = {bf16_weight(32, 31), bf16_weight(16, 32)};
  std::vector<Matrix> stacked = {bf16_weight(32, 31), bf16_weight(16, 32)};
  Matrix* stack[] = {&stacked[0], &stacked[1]};
  ASSERT_TRUE(gpu_->make_adjacent(stack));
  for (int64_t M : {1, 3}) {
    const Normed x = normed(M, 40 + static_cast<uint32_t>(M));
    for (const std::vector<Matrix>* w : {&apart, &stacked}) {
      const std::string what = std::string(w == &apart ? "apart" : "stacked") + ", M = " + std::to_string(M);
      const Ran r = compare(
          x, static_cast<size_t>(M * 48),
          [&](Activations a, float* y) {
            const LinearPart parts[] = {{&(*w)[0], nullptr, y}, {&(*w)[1], nullptr, y + M * 32}};
            gpu_->linear_parts(a, M, parts);
          },
          what);
      EXPECT_EQ(r.casts_plain, 1) << what;
      EXPECT_EQ(r.casts_twin, 0) << what;
      EXPECT_EQ(r.reads_twin, 1) << what;
    }
    release(x);
  }
}

// A captured norm and linear: the twin leaves the cast out of the graph. On the emulated
// runtime, where a cuBLAS call is one node, exactly: rmsnorm and the GEMM (2), not rmsnorm, the
// cast and the GEMM (3). The replay writes what the eager call does.
TEST_F(CudaActivationTwins, CapturedStepHasNoCastNode) {
  const Matrix w = bf16_weight(64, 51);
  const Normed x = normed(1, 52);
  float* h = up(*gpu_, randn(static_cast<size_t>(kK), 53));
  auto* y = static_cast<float*>(gpu_->alloc(64 * 4));
  auto capture = [&](const std::function<void()>& step) {
    step();  // workspaces are sized outside captures
    gpu_->begin_capture();
    step();
    return gpu_->end_capture();
  };
  const int64_t plain = gpu_->captured_nodes(capture([&] {
    gpu_->rmsnorm(h, norm_, 1, kEps, x.f32);
    gpu_->linear(x.f32, 1, w, nullptr, y);
  }));
  auto twin_step = [&] {
    const ActivationsOut out{x.f32, x.bf16};
    gpu_->rmsnorm(h, norm_, 1, kEps, out);
    gpu_->linear(out, 1, w, nullptr, y);
  };
  const int64_t graph = capture(twin_step);
  const int64_t with_twin = gpu_->captured_nodes(graph);
  EXPECT_LT(with_twin, plain);
#ifdef SHARDLM_CUDA_EMULATION
  EXPECT_EQ(plain, 3);
  EXPECT_EQ(with_twin, 2);
#endif
  const std::vector<float> junk(64, -7.0f);
  gpu_->copy_to_device(y, junk.data(), 64 * 4);
  gpu_->replay(graph);
  const auto replayed = down(*gpu_, y, 64);
  gpu_->copy_to_device(y, junk.data(), 64 * 4);
  twin_step();
  const auto eager = down(*gpu_, y, 64);
  EXPECT_EQ(0, std::memcmp(replayed.data(), eager.data(), 64 * 4));
  EXPECT_NE(eager[0], -7.0f);
  gpu_->drop_captures();
  gpu_->free(h);
  gpu_->free(y);
  release(x);
}

}  // namespace
}  // namespace shardlm
