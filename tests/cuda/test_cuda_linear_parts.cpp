// CudaBackend::make_adjacent and linear_parts (src/compute/cuda_linear_parts.cpp): a layer's
// projections of one input as one stacked GEMM. Each part's result is checked against the CPU
// backend's linear and against the CUDA backend's own linear() on that part alone; the weights
// keep their values and the backend its weight bytes when they move; which path ran is read off
// stacked_linears(). Skips without a GPU (and runs on the emulated runtime).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend_ops_fixture.h"
#include "common/backend_data.h"
#include "compute/backend.h"
#include "compute/cuda_backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"

namespace shardlm {
namespace {

using test::down;
using test::randn;
using test::up;

// |a - b| <= rel * max |a| per element.
void expect_close(const std::vector<float>& want, const std::vector<float>& got, double rel, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(want[i], got[i], rel * scale + 1e-6) << what << " [" << i << "]";
}

// One weight of a stack: its host values and its CPU and CUDA forms.
struct Part {
  std::vector<uint16_t> bf16;
  std::vector<float> f32, bias;
  TensorView w, b;
};

Part make_part(int64_t N, int64_t K, DType dt, uint32_t seed) {
  Part p;
  p.f32 = randn(static_cast<size_t>(N * K), seed, 0.05f);
  if (dt == DType::BF16) {
    p.bf16.resize(p.f32.size());
    for (size_t i = 0; i < p.f32.size(); ++i) p.bf16[i] = f32_to_bf16(p.f32[i]);
    p.w = test::tensor_view("w", dt, {N, K}, p.bf16.data(), p.bf16.size() * 2);
  } else {
    p.w = test::tensor_view("w", dt, {N, K}, p.f32.data(), p.f32.size() * 4);
  }
  p.bias = randn(static_cast<size_t>(N), seed + 1000);
  p.b = test::tensor_view("b", DType::F32, {N}, p.bias.data(), p.bias.size() * 4);
  return p;
}

class CudaLinearParts : public CudaBackendOps {
 protected:
  CudaBackend& gpu() { return *dynamic_cast<CudaBackend*>(gpu_.get()); }

  // The parts' weights and biases on both backends.
  struct Loaded {
    std::vector<Matrix> cw, gw;
    std::vector<Vector> cb, gb;
  };
  Loaded load(const std::vector<Part>& host) {
    Loaded l;
    for (const Part& p : host) {
      l.cw.push_back(cpu_.load_matrix(p.w));
      l.gw.push_back(gpu_->load_matrix(p.w));
      l.cb.push_back(cpu_.load_vector(p.b));
      l.gb.push_back(gpu_->load_vector(p.b));
    }
    return l;
  }

  // linear_parts over `mats` (with each part's bias where `biased`) into the outputs given, against
  // the CPU's linear per part (tolerance: the GPU rounds activations to bf16 for bf16 weights) and
  // the GPU's own linear per part (summation order only). Returns the stacked_linears() step.
  int64_t check(const std::vector<Matrix>& cpu_w, const std::vector<Matrix>& gpu_w, const std::vector<Vector>& cpu_b,
                const std::vector<Vector>& gpu_b, int64_t M, bool biased, bool packed_outputs, double rel) {
    const int64_t K = cpu_w[0].cols;
    const auto x = randn(static_cast<size_t>(M * K), 77 + static_cast<uint32_t>(M));
    float* xg = up(*gpu_, x);
    int64_t total = 0;
    for (const Matrix& m : gpu_w) total += m.rows;
    // Outputs one after another, or each with a gap after it (not packed).
    auto* out = static_cast<float*>(gpu_->alloc(static_cast<size_t>(M * (total + 8 * gpu_w.size())) * 4));
    std::vector<LinearPart> parts;
    std::vector<float*> ys;
    float* at = out;
    for (size_t i = 0; i < gpu_w.size(); ++i) {
      ys.push_back(at);
      parts.push_back({&gpu_w[i], biased ? &gpu_b[i] : nullptr, at});
      at += M * gpu_w[i].rows + (packed_outputs ? 0 : 8);
    }
    const int64_t before = gpu().stacked_linears();
    gpu_->linear_parts(xg, M, parts);
    const int64_t stacked = gpu().stacked_linears() - before;
    for (size_t i = 0; i < gpu_w.size(); ++i) {
      const size_t n = static_cast<size_t>(M * gpu_w[i].rows);
      const auto got = down(*gpu_, ys[i], n);
      std::vector<float> want(n);
      cpu_.linear(x.data(), M, cpu_w[i], biased ? &cpu_b[i] : nullptr, want.data());
      const std::string what = "part " + std::to_string(i) + " M=" + std::to_string(M);
      expect_close(want, got, rel, what + " against the CPU");
      auto* alone = static_cast<float*>(gpu_->alloc(n * 4));
      gpu_->linear(xg, M, gpu_w[i], biased ? &gpu_b[i] : nullptr, alone);
      expect_close(down(*gpu_, alone, n), got, 1e-5, what + " against linear() alone");
      gpu_->free(alone);
    }
    gpu_->free(xg);
    gpu_->free(out);
    return stacked;
  }
};

TEST_F(CudaLinearParts, AdjacentBf16QkvRunsAsOneGemm) {
  const int64_t K = 96;
  std::vector<Part> host;
  for (auto [N, seed] : {std::pair<int64_t, uint32_t>{64, 1}, {16, 2}, {16, 3}})
    host.push_back(make_part(N, K, DType::BF16, seed));
  auto [cw, gw, cb, gb] = load(host);
  // Separate: one cast, a GEMM per part; bit for bit each part's linear().
  for (int64_t M : {1, 7}) EXPECT_EQ(check(cw, gw, cb, gb, M, /*biased=*/M == 7, true, 1e-2), 0);
  const size_t bytes = gpu().weight_bytes();
  Matrix* stack[] = {&gw[0], &gw[1], &gw[2]};
  ASSERT_TRUE(gpu_->make_adjacent(stack));
  EXPECT_EQ(gpu().weight_bytes(), bytes);
  int64_t row = 0;
  for (size_t i = 0; i < gw.size(); ++i) {
    EXPECT_EQ(static_cast<const uint16_t*>(gw[i].data), static_cast<const uint16_t*>(gw[0].data) + row * K);
    row += gw[i].rows;
    const auto back = down(*gpu_, static_cast<const uint16_t*>(gw[i].data), host[i].bf16.size());
    EXPECT_EQ(0, std::memcmp(back.data(), host[i].bf16.data(), back.size() * 2)) << "part " << i << " moved wrongly";
  }
  // One row into packed outputs (the GEMM writes them in place), with biases, into gaps, several
  // rows: one stacked GEMM each time.
  EXPECT_EQ(check(cw, gw, cb, gb, 1, false, true, 1e-2), 1);
  EXPECT_EQ(check(cw, gw, cb, gb, 1, true, true, 1e-2), 1);
  EXPECT_EQ(check(cw, gw, cb, gb, 1, false, false, 1e-2), 1);
  EXPECT_EQ(check(cw, gw, cb, gb, 33, true, true, 1e-2), 1);
}

TEST_F(CudaLinearParts, AdjacentF32GateUp) {
  const int64_t K = 40;
  std::vector<Part> host;  // moved in, not copied: the views point into each part's own vectors
  host.push_back(make_part(24, K, DType::F32, 5));
  host.push_back(make_part(24, K, DType::F32, 6));
  auto [cw, gw, cb, gb] = load(host);
  Matrix* stack[] = {&gw[0], &gw[1]};
  ASSERT_TRUE(gpu_->make_adjacent(stack));
  for (int64_t M : {1, 4}) EXPECT_EQ(check(cw, gw, cb, gb, M, false, true, 1e-5), 1);
}

// fp8 weights kept as codes: parts that start a 128-row block, all but the last ending one, stack
// (codes and scale rows); read directly for a few rows and by the W8A8 / dequantised path past
// them. A part off the block grid keeps the parts apart, each run alone.
TEST_F(CudaLinearParts, Fp8PartsStackOnTheBlockGrid) {
  const int64_t K = 256, br = 128, bc = 128;
  struct Fp8Host {
    std::vector<uint8_t> q;
    std::vector<float> s;
    TensorView w, sv;
  };
  auto make = [&](int64_t R, uint32_t seed) {
    Fp8Host f;
    std::mt19937 g(seed);
    f.q.resize(static_cast<size_t>(R * K));
    for (auto& b : f.q) b = static_cast<uint8_t>(g() & 0xff);
    for (auto& b : f.q)
      if ((b & 0x7f) == 0x7f) b = 0x3c;  // no NaN codes
    f.s = randn(static_cast<size_t>(((R + br - 1) / br) * (K / bc)), seed + 1, 0.01f);
    for (float& s : f.s) s = std::fabs(s) + 1e-4f;
    f.w = test::tensor_view("w", DType::F8_E4M3, {R, K}, f.q.data(), f.q.size());
    f.sv = test::tensor_view("w_scale_inv", DType::F32, {(R + br - 1) / br, K / bc}, f.s.data(), f.s.size() * 4);
    return f;
  };
  // q_a, the latent and the rope key of an MLA layer, in miniature: 256, 128 and 64 rows.
  std::vector<Fp8Host> host;  // moved in, not copied: the views point into each one's own vectors
  host.push_back(make(256, 1));
  host.push_back(make(192, 2));
  auto load = [&](const Fp8Host& f, int64_t r0, int64_t nr, bool keep) {
    return gpu_->load_fp8_matrix(f.w, f.sv, br, bc, r0, nr, 0, K, keep);
  };
  std::vector<Matrix> gw = {load(host[0], 0, 256, true), load(host[1], 0, 128, true), load(host[1], 128, 64, true)};
  // The CPU's weights: the same slices dequantised to bf16 (the host's rounding).
  std::vector<Matrix> cw;
  std::vector<std::vector<uint16_t>> deq;
  for (auto [f, r0, nr] : {std::tuple<int, int64_t, int64_t>{0, 0, 256}, {1, 0, 128}, {1, 128, 64}}) {
    deq.emplace_back(static_cast<size_t>(nr * K));
    dequant_fp8_block(host[static_cast<size_t>(f)].w, host[static_cast<size_t>(f)].sv, br, bc, r0, nr, 0, K,
                      deq.back().data());
    cw.push_back(
        cpu_.load_matrix(test::tensor_view("d", DType::BF16, {nr, K}, deq.back().data(), deq.back().size() * 2)));
  }
  const std::vector<Vector> none(3);
  const size_t bytes = gpu().weight_bytes();
  Matrix* stack[] = {&gw[0], &gw[1], &gw[2]};
  ASSERT_TRUE(gpu_->make_adjacent(stack));
  EXPECT_EQ(gpu().weight_bytes(), bytes);
  for (int64_t M : {1, 12, 40}) {
    SCOPED_TRACE(::testing::Message() << "M = " << M);
    // W8A8 past the direct rows rounds the activations to e4m3: a looser bound there.
    EXPECT_EQ(check(cw, gw, none, none, M, false, true, M <= 16 ? 1e-2 : 8e-2), 1);
  }
  // Off the grid: rows 100.. of the second weight start inside a block.
  std::vector<Matrix> off = {load(host[0], 0, 256, true), load(host[1], 100, 64, true)};
  Matrix* off_stack[] = {&off[0], &off[1]};
  EXPECT_FALSE(gpu_->make_adjacent(off_stack));
  std::vector<uint16_t> d1(static_cast<size_t>(64 * K));
  dequant_fp8_block(host[1].w, host[1].sv, br, bc, 100, 64, 0, K, d1.data());
  const std::vector<Matrix> off_cpu = {
      cw[0], cpu_.load_matrix(test::tensor_view("d", DType::BF16, {64, K}, d1.data(), d1.size() * 2))};
  // Apart, within the direct rows: one cast, then the direct kernel on each part.
  const int64_t direct = gpu().fp8_direct_linears();
  EXPECT_EQ(check(off_cpu, off, none, none, 1, false, true, 1e-2), 0);
  EXPECT_EQ(gpu().fp8_direct_linears() - direct, 2 + 2);  // linear_parts', then check()'s linear() per part
}

TEST_F(CudaLinearParts, MixedDtypesStayApart) {
  const int64_t K = 32;
  Part a = make_part(16, K, DType::BF16, 9), b = make_part(8, K, DType::F32, 10);
  std::vector<Matrix> cw = {cpu_.load_matrix(a.w), cpu_.load_matrix(b.w)};
  std::vector<Matrix> gw = {gpu_->load_matrix(a.w), gpu_->load_matrix(b.w)};
  Matrix* stack[] = {&gw[0], &gw[1]};
  EXPECT_FALSE(gpu_->make_adjacent(stack));
  const std::vector<Vector> none(2);
  EXPECT_EQ(check(cw, gw, none, none, 3, false, true, 1e-2), 0);
}

// In a captured graph: the stacked call replays to its eager result, and its graph has fewer
// nodes than the parts' linears one by one. On the emulated runtime, where a cuBLAS call is one
// node, exactly: a decode token's q/k/v into packed outputs is the cast and one GEMM (2 nodes, not
// 6); with biases the split adds one (3, not 9); a GEMM a part after one cast when the weights
// are apart (4, not 6).
TEST_F(CudaLinearParts, CapturedStackHasFewerNodes) {
  const int64_t K = 64;
  std::vector<Part> host;
  for (auto [N, seed] : {std::pair<int64_t, uint32_t>{32, 21}, {16, 22}, {16, 23}})
    host.push_back(make_part(N, K, DType::BF16, seed));
  std::vector<Matrix> apart, stacked;
  std::vector<Vector> bias;
  for (const Part& p : host) {
    apart.push_back(gpu_->load_matrix(p.w));
    stacked.push_back(gpu_->load_matrix(p.w));
    bias.push_back(gpu_->load_vector(p.b));
  }
  Matrix* stack[] = {&stacked[0], &stacked[1], &stacked[2]};
  ASSERT_TRUE(gpu_->make_adjacent(stack));
  float* xg = up(*gpu_, randn(static_cast<size_t>(K), 24));
  auto* y = static_cast<float*>(gpu_->alloc(64 * 4));
  auto* want = static_cast<float*>(gpu_->alloc(64 * 4));
  // `step` captured (after one eager run: workspaces are sized outside captures): its graph.
  auto capture = [&](const std::function<void()>& step) {
    step();
    gpu_->begin_capture();
    step();
    return gpu_->end_capture();
  };
  auto parts = [&](const std::vector<Matrix>& w, bool biased) {
    return std::vector<LinearPart>{{&w[0], biased ? &bias[0] : nullptr, y},
                                   {&w[1], biased ? &bias[1] : nullptr, y + 32},
                                   {&w[2], biased ? &bias[2] : nullptr, y + 48}};
  };
  const std::vector<float> junk(64, -7.0f);
  for (bool biased : {false, true}) {
    SCOPED_TRACE(biased ? "with biases" : "without biases");
    const int64_t one_by_one = gpu_->captured_nodes(capture([&] {
      for (const LinearPart& p : parts(apart, biased)) gpu_->linear(xg, 1, *p.w, p.bias, p.y);
    }));
    const int64_t one_cast = gpu_->captured_nodes(capture([&] { gpu_->linear_parts(xg, 1, parts(apart, biased)); }));
    const int64_t graph = capture([&] { gpu_->linear_parts(xg, 1, parts(stacked, biased)); });
    const int64_t together = gpu_->captured_nodes(graph);
    // The stacked call's replay writes what it writes eagerly.
    gpu_->copy_to_device(y, junk.data(), 64 * 4);
    gpu_->replay(graph);
    const auto replayed = down(*gpu_, y, 64);
    gpu_->copy_to_device(y, junk.data(), 64 * 4);
    gpu_->linear_parts(xg, 1, parts(stacked, biased));
    const auto eager = down(*gpu_, y, 64);
    EXPECT_EQ(0, std::memcmp(replayed.data(), eager.data(), 64 * 4));
    EXPECT_NE(eager[0], -7.0f);
    EXPECT_LT(together, one_by_one);
    EXPECT_LT(one_cast, one_by_one);
#ifdef SHARDLM_CUDA_EMULATION
    EXPECT_EQ(one_by_one, biased ? 9 : 6);
    EXPECT_EQ(together, biased ? 3 : 2);
    EXPECT_EQ(one_cast, biased ? 7 : 4);
#endif
  }
  gpu_->drop_captures();
  for (void* p : {static_cast<void*>(xg), static_cast<void*>(y), static_cast<void*>(want)}) gpu_->free(p);
}

// A device without room for the moment's second copy keeps the parts apart: make_adjacent says
// so and changes nothing, and linear_parts still gives each part's result. Needs a device small
// enough to fill: the emulated runtime under SHARDLM_EMULATED_GPU_MEMORY_MIB (registered so in
// tests/cuda/CMakeLists.txt); skips elsewhere.
TEST_F(CudaLinearParts, NoRoomToMoveKeepsThePartsApart) {
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(gpu_->device_memory(&free_bytes, &total_bytes));
  if (total_bytes > (size_t{256} << 20))
    GTEST_SKIP() << "needs a device of at most 256 MiB (the emulated runtime under SHARDLM_EMULATED_GPU_MEMORY_MIB)";
  const int64_t K = 256;
  std::vector<Part> host;
  for (auto [N, seed] : {std::pair<int64_t, uint32_t>{256, 31}, {128, 32}})
    host.push_back(make_part(N, K, DType::BF16, seed));
  auto [cw, gw, cb, gb] = load(host);
  // Room for the step's buffers, not for a second copy of the weights (192 KiB).
  gpu_->device_memory(&free_bytes, &total_bytes);
  void* filler = gpu_->alloc(free_bytes - (64 << 10));
  const Matrix before[] = {gw[0], gw[1]};
  const size_t bytes = gpu().weight_bytes();
  Matrix* stack[] = {&gw[0], &gw[1]};
  EXPECT_FALSE(gpu_->make_adjacent(stack));
  EXPECT_EQ(gw[0].data, before[0].data);
  EXPECT_EQ(gw[1].data, before[1].data);
  EXPECT_EQ(gpu().weight_bytes(), bytes);
  const std::vector<Vector> none(2);
  EXPECT_EQ(check(cw, gw, none, none, 1, false, true, 1e-2), 0);
  gpu_->free(filler);
  // With the room back, they move.
  EXPECT_TRUE(gpu_->make_adjacent(stack));
  EXPECT_EQ(check(cw, gw, none, none, 1, false, true, 1e-2), 1);
}

}  // namespace
}  // namespace shardlm
