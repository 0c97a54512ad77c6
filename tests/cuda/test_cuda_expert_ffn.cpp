// The routed experts' SwiGLU on the CUDA backend with each expert's gate and up stacked
// (LocalExperts::assign with the backend: make_adjacent, one weight [2 inter, H] per expert, one
// grouped call for both) against the same experts loaded apart:
//   * run_routed_experts, eager and replayed in a graph after the offsets changed: every routed
//     row has the apart run's bits, on fp8 (the direct kernel, and the grouped W8A8 GEMM past 16
//     rows an expert), bf16 (direct kernel, grouped bf16 GEMM) and fp32 weights, and each replay
//     gives the eager run's bits for its offsets;
//   * run_experts (prefill's grouped_linear): fp8's grouped kernels bit for bit, cuBLAS's bf16 and
//     fp32 GEMMs to summation order (a wider product may take another algorithm);
//   * a captured step of the routed experts takes fewer nodes;
//   * run_experts reads its rows' twin (and on bf16 experts the activation's) instead of casting;
//   * silu_mul_stacked against silu_mul, twin included;
//   * a device without room to move all experts at once stacks them expert by expert.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "arch/expert_ffn.h"
#include "arch/scratch.h"
#include "backend_ops_fixture.h"
#include "common/backend_data.h"
#include "compute/cuda_backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"

namespace shardlm {
namespace {

using test::down;
using test::randn;
using test::up;

constexpr int64_t kH = 256, kInter = 128, kExperts = 4;
constexpr float kUnwritten = 777.0f;
// A routed call of the direct kernel on rows without a twin: the rows' cast, the device's pass
// list and the matmul. Stacking saves the up projection's (a step's rows have a twin: 2 nodes).
constexpr int64_t kRoutedCallNodes = 3;

class CudaExpertFfn : public CudaBackendOps {
 protected:
  // One weight [rows, cols] as a checkpoint tensor: fp8 codes with 128 x 128 block scales (no NaN
  // codes), or random bf16 / fp32 values.
  struct HostWeight {
    TensorView w, scale;
  };
  HostWeight host_weight(DType dt, int64_t rows, int64_t cols, uint32_t seed) {
    if (dt != DType::F8_E4M3) return {store_.random(dt, rows, cols, seed, 0.06f), {}};
    std::mt19937 gen(seed);
    std::vector<uint8_t>& codes = codes_.emplace_back(static_cast<size_t>(rows * cols));
    for (auto& c : codes) c = static_cast<uint8_t>(gen() & 0x7e);
    const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    std::vector<float>& scales = scales_.emplace_back(static_cast<size_t>(sr * sc));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 2e-3f * static_cast<float>(1 + (seed + i) % 5);
    return {test::tensor_view("w", dt, {rows, cols}, codes.data(), codes.size()),
            test::tensor_view("w_scale_inv", DType::F32, {sr, sc}, scales.data(), scales.size() * 4)};
  }
  Matrix load(const HostWeight& h) {
    if (h.w.dtype != DType::F8_E4M3) return gpu_->load_matrix(h.w);
    const int64_t rows = h.w.shape[0], cols = h.w.shape[1];
    return gpu_->load_fp8_matrix(h.w, h.scale, 128, 128, 0, rows, 0, cols, /*keep=*/true);
  }

  // The same experts loaded twice: `apart` as loaded, `stacked` with the backend asked to stack.
  void load_experts(DType dt, LocalExperts* apart, LocalExperts* stacked) {
    std::vector<ExpertWeights> a, s;
    for (int64_t e = 0; e < kExperts; ++e) {
      const auto seed = static_cast<uint32_t>(40 + 3 * e);
      const HostWeight g = host_weight(dt, kInter, kH, seed), u = host_weight(dt, kInter, kH, seed + 1),
                       d = host_weight(dt, kH, kInter, seed + 2);
      a.push_back({load(g), load(u), load(d)});
      s.push_back({load(g), load(u), load(d)});
    }
    apart->assign(std::move(a));
    stacked->assign(std::move(s), gpu_.get());
    ASSERT_FALSE(apart->stacked());
    ASSERT_TRUE(stacked->stacked()) << dtype_name(dt);
  }

  // Device buffers of a routed run over P rows: x (random), the groups' offsets, and out.
  struct Routed {
    ComputeBackend& b;
    int64_t P;
    float *x, *out;
    int32_t* off;
    Routed(ComputeBackend& backend, int64_t rows, uint32_t seed) : b(backend), P(rows) {
      x = up(b, randn(static_cast<size_t>(P * kH), seed, 1.0f));
      out = up(b, std::vector<float>(static_cast<size_t>(P * kH), kUnwritten));
      off = static_cast<int32_t*>(b.alloc((kExperts + 1) * sizeof(int32_t)));
    }
    ~Routed() {
      for (void* p : {static_cast<void*>(x), static_cast<void*>(out), static_cast<void*>(off)}) b.free(p);
    }
    // The groups' sizes onto the device as offsets, and out back to kUnwritten.
    void set(const std::vector<int32_t>& sizes) {
      std::vector<int32_t> o{0};
      for (int32_t n : sizes) o.push_back(o.back() + n);
      b.copy_to_device(off, o.data(), o.size() * sizeof(int32_t));
      b.copy_to_device(out, std::vector<float>(static_cast<size_t>(P * kH), kUnwritten).data(),
                       static_cast<size_t>(P * kH) * sizeof(float));
    }
    std::vector<float> result() const { return down(b, static_cast<const float*>(out), static_cast<size_t>(P * kH)); }
  };

  test::WeightStore store_;
  std::deque<std::vector<uint8_t>> codes_;
  std::deque<std::vector<float>> scales_;
};

int64_t sum(const std::vector<int32_t>& sizes) {
  int64_t n = 0;
  for (int32_t s : sizes) n += s;
  return n;
}

// The routed rows written and their bits equal; the rows past them unwritten in both.
void expect_same_rows(const std::vector<float>& want, const std::vector<float>& got, int64_t rows,
                      const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  const size_t routed = static_cast<size_t>(rows * kH);
  for (size_t i = 0; i < routed; ++i) ASSERT_NE(want[i], kUnwritten) << what << ": element " << i << " unwritten";
  ASSERT_EQ(std::memcmp(want.data(), got.data(), routed * sizeof(float)), 0) << what;
  for (size_t i = routed; i < got.size(); ++i) ASSERT_EQ(got[i], kUnwritten) << what << ": element " << i;
}

TEST_F(CudaExpertFfn, StackedRoutedExpertsGiveTheApartBitsEagerAndReplayed) {
  // Up to 16 rows an expert (the direct kernel), then past it (fp8: the grouped W8A8 GEMM; bf16:
  // the grouped bf16 GEMM; fp32: the direct kernel still).
  const std::vector<std::vector<std::vector<int32_t>>> step_sets = {{{3, 0, 8, 1}, {0, 5, 5, 2}},
                                                                    {{40, 17, 70, 23}, {0, 90, 30, 25}}};
  for (const DType dt : {DType::F8_E4M3, DType::BF16, DType::F32}) {
    LocalExperts apart, stacked;
    load_experts(dt, &apart, &stacked);
    for (const auto& steps : step_sets) {
      const int64_t P = std::max(sum(steps[0]), sum(steps[1])) + 4;  // rows past the groups too
      const std::string what = std::string(dtype_name(dt)) + ", " + std::to_string(P) + " rows";
      Routed a(*gpu_, P, 91), s(*gpu_, P, 91);
      Scratch scratch_a(*gpu_), scratch_s(*gpu_);
      auto run = [&](Routed& r, Scratch& scratch, const LocalExperts& ex) {
        run_routed_experts(scratch, ex, r.x, P, P, r.off, r.out);
      };
      a.set(steps[0]);
      s.set(steps[0]);
      run(a, scratch_a, apart);
      run(s, scratch_s, stacked);
      expect_same_rows(a.result(), s.result(), sum(steps[0]), what + ", eager");
      const std::string path = gpu_->routed_linear_path();
      const bool many = sum(steps[0]) > 16 * kExperts;
      const char* want_path = !many || dt == DType::F32 ? "direct kernel"
                              : dt == DType::F8_E4M3    ? "grouped W8A8 GEMM"
                                                        : "grouped bf16 GEMM";
      EXPECT_NE(path.find(want_path), std::string::npos) << what << ": " << path;
      gpu_->begin_capture();
      run(a, scratch_a, apart);
      const int64_t ga = gpu_->end_capture();
      gpu_->begin_capture();
      run(s, scratch_s, stacked);
      const int64_t gs = gpu_->end_capture();
      for (const auto& sizes : steps) {
        a.set(sizes);
        s.set(sizes);
        gpu_->replay(ga);
        gpu_->replay(gs);
        expect_same_rows(a.result(), s.result(), sum(sizes), what + ", replayed (" + path + ")");
        // And the eager run of these sizes: a replay that kept the captured offsets, or ran
        // nothing, gives the stacked and apart graphs the same wrong rows.
        Routed e(*gpu_, P, 91);
        Scratch scratch_e(*gpu_);
        e.set(sizes);
        run(e, scratch_e, apart);
        expect_same_rows(e.result(), a.result(), sum(sizes), what + ", replayed against eager (" + path + ")");
      }
      gpu_->drop_captures();
    }
  }
}

TEST_F(CudaExpertFfn, StackedEagerExpertsMatchApart) {
  const std::vector<int64_t> offsets = {0, 40, 40, 150, 173};  // groups of 40, 0, 110 and 23 rows
  const int64_t R = offsets.back();
  const std::vector<float> x = randn(static_cast<size_t>(R * kH), 92, 1.0f);
  for (const DType dt : {DType::F8_E4M3, DType::BF16, DType::F32}) {
    LocalExperts apart, stacked;
    load_experts(dt, &apart, &stacked);
    float* xg = up(*gpu_, x);
    float* ya = up(*gpu_, std::vector<float>(x.size(), kUnwritten));
    float* ys = up(*gpu_, std::vector<float>(x.size(), kUnwritten));
    Scratch scratch(*gpu_);
    run_experts(scratch, apart, kH, xg, offsets, ya);
    run_experts(scratch, stacked, kH, xg, offsets, ys);
    const std::string path = gpu_->grouped_linear_path();
    const std::vector<float> want = down(*gpu_, static_cast<const float*>(ya), x.size());
    const std::vector<float> got = down(*gpu_, static_cast<const float*>(ys), x.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NE(want[i], kUnwritten) << dtype_name(dt) << " element " << i;
    if (dt == DType::F8_E4M3) {
      // The grouped fp8 kernels compute each element alone: the same bits.
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << path;
    } else {
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-4 * std::fabs(want[i]) + 1e-5) << dtype_name(dt) << " element " << i;
    }
    for (float* p : {xg, ya, ys}) gpu_->free(p);
  }
}

// run_experts on rows with a twin (an eager step's gathered or exchanged rows) reads it instead of
// casting them: one cast fewer per input projection, the same bits, in one chunk or several. On
// bf16 experts the down projection reads the activation's twin too, so no row is cast at all.
TEST_F(CudaExpertFfn, EagerExpertsReadTheRowsTwin) {
  // fp8: groups of up to 16 rows read bf16 (the 5 and the 13), the others quantise the fp32 rows.
  const std::vector<int64_t> offsets = {0, 5, 5, 120, 133};
  const int64_t R = offsets.back();
  const std::vector<float> x = randn(static_cast<size_t>(R * kH), 95, 1.0f);
  std::vector<uint16_t> twin(x.size());
  for (size_t i = 0; i < x.size(); ++i) twin[i] = f32_to_bf16(x[i]);
  for (const DType dt : {DType::BF16, DType::F8_E4M3}) {
    LocalExperts apart, stacked;
    load_experts(dt, &apart, &stacked);
    EXPECT_EQ(experts_read_twins(*gpu_, apart), dt == DType::BF16);
    EXPECT_FALSE(experts_read_twins(cpu_, apart));
    float* xg = up(*gpu_, x);
    uint16_t* tg = up(*gpu_, twin);
    float* y_plain = up(*gpu_, std::vector<float>(x.size(), kUnwritten));
    float* y_twin = up(*gpu_, std::vector<float>(x.size(), kUnwritten));
    Scratch scratch(*gpu_);
    for (const LocalExperts* ex : {&apart, &stacked}) {
      for (const int64_t chunk : {int64_t{-1}, int64_t{50}}) {
        const std::string what = std::string(dtype_name(dt)) + (ex->stacked() ? " stacked" : " apart") +
                                 ", chunks of " + std::to_string(chunk) + " rows";
        CudaBackend& cuda = *dynamic_cast<CudaBackend*>(gpu_.get());
        // Once first: a shape's first GEMM may settle its path (a cuBLAS refusal, the W8A8 probe).
        run_experts(scratch, *ex, kH, xg, offsets, y_plain, chunk);
        int64_t casts = cuda.activation_casts();
        run_experts(scratch, *ex, kH, xg, offsets, y_plain, chunk);
        const int64_t casts_plain = cuda.activation_casts() - casts;
        casts = cuda.activation_casts();
        run_experts(scratch, *ex, kH, Activations{xg, tg}, offsets, y_twin, chunk);
        const int64_t casts_twin = cuda.activation_casts() - casts;
        const std::vector<float> want = down(*gpu_, static_cast<const float*>(y_plain), x.size());
        const std::vector<float> got = down(*gpu_, static_cast<const float*>(y_twin), x.size());
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << what;
        // One grouped call per projection and chunk; the input's are 1 (stacked) or 2 a chunk. In
        // chunks of 50 (at least the largest expert's 115 rows): experts 0-1, 2 and 3; on fp8 the
        // chunk of expert 2 alone quantises its fp32 rows (W8A8) and casts nothing either way.
        const int64_t chunks = chunk < 0 ? 1 : dt == DType::F8_E4M3 ? 2 : 3;
        const int64_t in_calls = (ex->stacked() ? 1 : 2) * chunks;
        EXPECT_EQ(casts_plain - casts_twin, in_calls)
            << what << ": " << casts_plain << " casts, " << casts_twin << " with the twin";
        if (dt == DType::BF16) {
          EXPECT_EQ(casts_twin, 0) << what;
        }
      }
    }
    for (float* p : {xg, y_plain, y_twin}) gpu_->free(p);
    gpu_->free(tg);
  }
}

// A captured step of the routed experts: the stacked weights save the up projection's call.
TEST_F(CudaExpertFfn, CapturedStackedExpertsTakeFewerNodes) {
  for (const DType dt : {DType::F8_E4M3, DType::BF16}) {
    LocalExperts apart, stacked;
    load_experts(dt, &apart, &stacked);
    Routed r(*gpu_, 16, 93);
    r.set({3, 0, 8, 1});
    Scratch scratch(*gpu_);
    auto nodes = [&](const LocalExperts& ex) {
      run_routed_experts(scratch, ex, r.x, r.P, r.P, r.off, r.out);  // sizes the workspaces first
      gpu_->begin_capture();
      run_routed_experts(scratch, ex, r.x, r.P, r.P, r.off, r.out);
      const int64_t n = gpu_->captured_nodes(gpu_->end_capture());
      gpu_->drop_captures();
      return n;
    };
    const int64_t a = nodes(apart), s = nodes(stacked);
    std::printf("[ nodes ] %s routed experts: %lld apart, %lld stacked\n", dtype_name(dt), static_cast<long long>(a),
                static_cast<long long>(s));
    EXPECT_EQ(a - s, kRoutedCallNodes) << dtype_name(dt);
  }
}

TEST_F(CudaExpertFfn, SiluMulStackedIsSiluMulOnEachRowsHalves) {
  const int64_t rows = 37, width = 200;
  const std::vector<float> gate_up = randn(static_cast<size_t>(rows * 2 * width), 94, 4.0f);
  std::vector<float> gate, upv;
  test::split_stacked_rows(gate_up, rows, width, &gate, &upv);
  const size_t n = static_cast<size_t>(rows * width);
  float* gu = up(*gpu_, gate_up);
  float* g = up(*gpu_, gate);
  float* u = up(*gpu_, upv);
  float* want = up(*gpu_, std::vector<float>(n));
  float* got = up(*gpu_, std::vector<float>(n));
  uint16_t* want_twin = up(*gpu_, std::vector<uint16_t>(n));
  uint16_t* got_twin = up(*gpu_, std::vector<uint16_t>(n));
  gpu_->silu_mul(g, u, {want, want_twin}, static_cast<int64_t>(n));
  gpu_->silu_mul_stacked(gu, rows, width, {got, got_twin});
  const std::vector<float> w = down(*gpu_, static_cast<const float*>(want), n);
  const std::vector<float> o = down(*gpu_, static_cast<const float*>(got), n);
  EXPECT_EQ(std::memcmp(w.data(), o.data(), n * sizeof(float)), 0);
  EXPECT_EQ(down(*gpu_, static_cast<const uint16_t*>(want_twin), n),
            down(*gpu_, static_cast<const uint16_t*>(got_twin), n));
  // And the CPU's silu_mul to its tolerance (test_model_kernels.cpp: CUDA expf within 2 ulp).
  std::vector<float> cpu(n);
  cpu_.silu_mul(gate.data(), upv.data(), cpu.data(), static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(o[i], cpu[i], 1e-5 * std::fabs(cpu[i]) + 1e-7) << i;
  for (void* p : {static_cast<void*>(gu), static_cast<void*>(g), static_cast<void*>(u), static_cast<void*>(want),
                  static_cast<void*>(got), static_cast<void*>(want_twin), static_cast<void*>(got_twin)})
    gpu_->free(p);
}

// A device with room for one expert's second copy, not for all of them at once: the experts are
// stacked one by one (each expert's gate and up adjacent, the experts apart), with the same
// results. Needs a device small enough to fill: the emulated runtime under
// SHARDLM_EMULATED_GPU_MEMORY_MIB (registered so in tests/cuda/CMakeLists.txt); skips elsewhere.
TEST_F(CudaExpertFfn, NoRoomForAllAtOnceStacksExpertByExpert) {
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(gpu_->device_memory(&free_bytes, &total_bytes));
  if (total_bytes > (size_t{256} << 20))
    GTEST_SKIP() << "needs a device of at most 256 MiB (the emulated runtime under SHARDLM_EMULATED_GPU_MEMORY_MIB)";
  std::vector<ExpertWeights> a, s;
  for (int64_t e = 0; e < kExperts; ++e) {
    const auto seed = static_cast<uint32_t>(60 + 3 * e);
    const HostWeight g = host_weight(DType::BF16, kInter, kH, seed), u = host_weight(DType::BF16, kInter, kH, seed + 1),
                     d = host_weight(DType::BF16, kH, kInter, seed + 2);
    a.push_back({load(g), load(u), load(d)});
    s.push_back({load(g), load(u), load(d)});
  }
  // Room for one expert's gate and up (128 KiB) and a little, not for all four's (512 KiB).
  gpu_->device_memory(&free_bytes, &total_bytes);
  void* filler = gpu_->alloc(free_bytes - (192 << 10));
  LocalExperts apart, stacked;
  apart.assign(std::move(a));
  stacked.assign(std::move(s), gpu_.get());
  gpu_->free(filler);
  ASSERT_TRUE(stacked.stacked());
  const size_t pair_bytes = static_cast<size_t>(2 * kInter * kH) * 2;
  for (int64_t e = 1; e < kExperts; ++e)
    EXPECT_NE(stacked.gate()[e]->data, static_cast<const uint8_t*>(stacked.gate()[e - 1]->data) + pair_bytes)
        << "expert " << e << " follows expert " << e - 1 << ": moved all at once";
  Routed ra(*gpu_, 16, 95), rs(*gpu_, 16, 95);
  ra.set({3, 0, 8, 1});
  rs.set({3, 0, 8, 1});
  Scratch scratch(*gpu_);
  run_routed_experts(scratch, apart, ra.x, 16, 16, ra.off, ra.out);
  run_routed_experts(scratch, stacked, rs.x, 16, 16, rs.off, rs.out);
  expect_same_rows(ra.result(), rs.result(), 12, "expert by expert");
}

}  // namespace
}  // namespace shardlm
