// CudaBackend::grouped_linear (cuBLAS grouped batched GEMM, or its downgrades) against
//   (a) CudaBackend::linear run per group: the same bf16 / fp32 GEMM one group at a time, so only
//       the summation order may differ: |d| <= 1e-5 |ref| + 1e-5, plus 2^-8 |ref| when the path
//       in use writes bf16 (read from grouped_linear_path() after the call);
//   (b) the CPU backend's grouped_linear, with test_cuda_backend_ops's linear tolerances (1e-5
//       of the largest output for fp32 weights, 1e-2 for bf16: the GPU rounds activations to bf16).
// Groups with empty ones among them, all rows in one group, all groups empty, groups starting
// past row 0 (earlier rows of y untouched), K = 80 and 72, bf16 and fp32 weights, and mixed
// dtypes (run per group: bit for bit linear's); fp8 weights kept fp8 (one grouped launch for the
// small groups, bit for bit linear's; one grouped W8A8 launch for the larger); the routed call, whose groups are in
// device memory, eager and replayed in a graph; the grouped GEMMs' tensor-core products (wgmma on
// sm_90 after its self-check, or mma.sync). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/backend_data.h"
#include "common/gpu.h"
#include "compute/backend.h"
#include "compute/cpu_backend.h"
#include "compute/cuda_backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"

namespace shardlm {
namespace {

using test::down;
using test::randn;
using test::up;

constexpr float kUntouched = 12345.0f;  // y's rows before the first group keep it

class CudaGroupedLinear : public ::testing::Test {
 protected:
  void SetUp() override {
    SHARDLM_REQUIRE_GPU();
    gpu_ = make_backend("cuda");
  }

  // A random weight [N, K] in `dtype`, loaded on both backends (host bytes kept alive: the CPU
  // backend may use them in place).
  std::pair<Matrix, Matrix> weight(DType dtype, int64_t N, int64_t K, uint32_t seed) {
    const TensorView t = store_.random(dtype, N, K, seed, 0.05f);
    return {cpu_.load_matrix(t), gpu_->load_matrix(t)};
  }

  // One case: groups of `rows` after `first` leading rows, weights of `dtypes[g]`.
  void check(const std::vector<int64_t>& rows, int64_t first, int64_t N, int64_t K, const std::vector<DType>& dtypes,
             const std::string& what) {
    SCOPED_TRACE(what);
    const size_t G = rows.size();
    std::vector<int64_t> offsets{first};
    for (int64_t n : rows) offsets.push_back(offsets.back() + n);
    const int64_t R = offsets.back();
    std::vector<Matrix> wc, wg;
    for (size_t g = 0; g < G; ++g) {
      auto [c, d] = weight(dtypes[g], N, K, static_cast<uint32_t>(1000 + 17 * g + K));
      wc.push_back(c);
      wg.push_back(d);
    }
    std::vector<const Matrix*> pc, pg;
    for (size_t g = 0; g < G; ++g) {
      pc.push_back(&wc[g]);
      pg.push_back(&wg[g]);
    }
    const std::vector<float> x = randn(static_cast<size_t>(R * K), static_cast<uint32_t>(R + K), 1.0f);
    const std::vector<float> fill(static_cast<size_t>(R * N), kUntouched);

    std::vector<float> y_cpu(fill);
    cpu_.grouped_linear(x.data(), offsets, pc, y_cpu.data());

    float* xg = up(*gpu_, x);
    float* yg = up(*gpu_, fill);
    float* yl = up(*gpu_, fill);
    gpu_->grouped_linear(xg, offsets, pg, yg);
    for (size_t g = 0; g < G; ++g) {
      const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
      if (n > 0) gpu_->linear(xg + r0 * K, n, wg[g], nullptr, yl + r0 * N);
    }
    const std::vector<float> got = down(*gpu_, static_cast<const float*>(yg), fill.size());
    const std::vector<float> per_group = down(*gpu_, static_cast<const float*>(yl), fill.size());
    const std::string path = gpu_->grouped_linear_path();
    std::printf("[ grouped ] %s: %s\n", what.c_str(), path.c_str());
    const bool bf16_out = path.find("bf16 out") != std::string::npos;
    bool mixed = false, all_bf16 = true;
    for (DType d : dtypes) {
      mixed = mixed || d != dtypes[0];
      all_bf16 = all_bf16 && d == DType::BF16;
    }

    double scale = 0;
    for (float v : y_cpu) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    const double cpu_rel = all_bf16 || mixed ? 1e-2 : 1e-5;
    for (int64_t i = 0; i < first * N; ++i) ASSERT_EQ(got[i], kUntouched) << "row " << i / N << " written";
    for (size_t i = static_cast<size_t>(first * N); i < got.size(); ++i) {
      const double ref = per_group[i];
      if (mixed) {
        // Mixed dtypes run linear() per group: the very same GEMMs.
        ASSERT_EQ(got[i], per_group[i]) << "element " << i;
      } else {
        const double tol = (bf16_out ? std::ldexp(1.0, -8) * std::fabs(ref) : 0.0) + 1e-5 * std::fabs(ref) + 1e-5;
        ASSERT_NEAR(ref, got[i], tol) << "against per-group linear, element " << i;
      }
      ASSERT_NEAR(y_cpu[i], got[i], cpu_rel * scale + 1e-6) << "against the CPU backend, element " << i;
    }
  }

  // G random fp8 weights [N, K] kept fp8 on the GPU (128 x 128 blocks, no NaN codes).
  std::vector<Matrix> fp8_weights(size_t G, int64_t N, int64_t K, uint32_t seed) {
    std::mt19937 gen(seed);
    std::vector<Matrix> wg;
    for (size_t g = 0; g < G; ++g) {
      std::vector<uint8_t>& codes = fp8_codes_.emplace_back(static_cast<size_t>(N * K));
      for (auto& c : codes) c = static_cast<uint8_t>(gen() & 0x7e);  // no NaN codes (0x7f, 0xff)
      std::vector<float>& scales =
          fp8_scales_.emplace_back(static_cast<size_t>((K + 127) / 128), 1e-2f * static_cast<float>(g + 1));
      TensorView tw, ts;
      tw.name = "w";
      tw.dtype = DType::F8_E4M3;
      tw.shape = {N, K};
      tw.data = codes.data();
      tw.nbytes = codes.size();
      ts.name = "w_scale_inv";
      ts.dtype = DType::F32;
      ts.shape = {1, (K + 127) / 128};
      ts.data = scales.data();
      ts.nbytes = scales.size() * 4;
      wg.push_back(gpu_->load_fp8_matrix(tw, ts, 128, 128, 0, N, 0, K, /*keep=*/true));
      EXPECT_EQ(wg.back().dtype, DType::F8_E4M3);
    }
    return wg;
  }

  // call() run eagerly on steps[0] and checked, then captured and replayed for every step, checked
  // after each (set() puts a step's offsets on the device first).
  template <class Set, class Call, class Check>
  void eager_then_replayed(const std::vector<std::vector<int32_t>>& steps, const Set& set, const Call& call,
                           const Check& check) {
    set(steps[0]);
    call();
    check(steps[0], "eager");
    gpu_->begin_capture();
    call();
    const int64_t graph = gpu_->end_capture();
    for (const auto& sizes : steps) {
      set(sizes);
      gpu_->replay(graph);
      check(sizes, "replayed");
    }
    gpu_->drop_captures();
  }

  // Device buffers of a routed call over G groups: rows x [max_rows, K] (random), the groups'
  // offsets, its output y and a reference output yl ([max_rows, N], kUntouched until written).
  struct RoutedBuffers {
    ComputeBackend& b;
    int64_t max_rows;
    std::vector<float> fill;
    float* x;
    int32_t* off;
    float* y;
    float* yl;
    RoutedBuffers(ComputeBackend& backend, int64_t N, int64_t K, int64_t rows, int64_t G, uint32_t seed)
        : b(backend), max_rows(rows), fill(static_cast<size_t>(rows * N), kUntouched) {
      x = up(b, randn(static_cast<size_t>(rows * K), seed, 1.0f));
      off = static_cast<int32_t*>(b.alloc(static_cast<size_t>(G + 1) * sizeof(int32_t)));
      y = up(b, fill);
      yl = up(b, fill);
    }
    ~RoutedBuffers() {
      for (void* p : {static_cast<void*>(x), static_cast<void*>(off), static_cast<void*>(y), static_cast<void*>(yl)})
        b.free(p);
    }
    static std::vector<int32_t> offsets_of(const std::vector<int32_t>& sizes) {
      std::vector<int32_t> o{0};
      for (int32_t n : sizes) o.push_back(o.back() + n);
      return o;
    }
    // The groups' offsets onto the device, and y back to kUntouched.
    void set(const std::vector<int32_t>& sizes) {
      const std::vector<int32_t> o = offsets_of(sizes);
      b.copy_to_device(off, o.data(), o.size() * sizeof(int32_t));
      b.copy_to_device(y, fill.data(), fill.size() * sizeof(float));
    }
    void clear_reference() { b.copy_to_device(yl, fill.data(), fill.size() * sizeof(float)); }
    std::vector<float> got() const { return down(b, static_cast<const float*>(y), fill.size()); }
    std::vector<float> want() const { return down(b, static_cast<const float*>(yl), fill.size()); }
  };

  CpuBackend cpu_;
  std::unique_ptr<ComputeBackend> gpu_;
  test::WeightStore store_;
  std::deque<std::vector<uint8_t>> fp8_codes_;
  std::deque<std::vector<float>> fp8_scales_;
};

const std::vector<int64_t> kMixedRows = {3, 0, 17, 1, 0, 64, 5, 2};
const std::vector<int64_t> kOneGroup = {0, 0, 0, 92, 0, 0, 0, 0};
const std::vector<int64_t> kNoRows = {0, 0, 0, 0, 0, 0, 0, 0};

TEST_F(CudaGroupedLinear, Bf16AndF32MatchPerGroupAndCpu) {
  for (const DType dt : {DType::BF16, DType::F32}) {
    const std::vector<DType> dtypes(8, dt);
    for (int64_t K : {80, 72}) {
      const std::string what = std::string(dtype_name(dt)) + ", K " + std::to_string(K);
      check(kMixedRows, 0, 96, K, dtypes, what + ", uneven groups");
      check(kMixedRows, 3, 96, K, dtypes, what + ", uneven groups from row 3");
      check(kOneGroup, 0, 96, K, dtypes, what + ", one group");
      check(kNoRows, 0, 96, K, dtypes, what + ", no rows");
    }
  }
}

TEST_F(CudaGroupedLinear, MixedDtypesRunPerGroup) {
  std::vector<DType> mixed(8, DType::BF16);
  mixed[2] = DType::F32;
  check(kMixedRows, 0, 96, 80, mixed, "mixed dtypes");
}

// Repeated calls of growing sizes reuse and grow the pointer array and workspaces.
TEST_F(CudaGroupedLinear, GrowingCallsStayCorrect) {
  const std::vector<DType> bf16(12, DType::BF16);
  check({1, 2}, 0, 64, 48, {DType::BF16, DType::BF16}, "two groups");
  check({4, 0, 9, 33, 1, 7, 0, 2, 150, 3, 6, 11}, 0, 64, 48, bf16, "twelve groups");
  check({1, 2}, 0, 64, 48, {DType::BF16, DType::BF16}, "two groups again");
}

// fp8 weights kept fp8 (128 x 128 blocks): the groups of up to 16 rows go through one grouped launch
// of the fp8 kernel. The larger ones, where there are two or more and K = 128, go through one
// grouped W8A8 launch on fp8 tensor cores (set_fp8_grouped_gemm, the default); otherwise each
// through one W8A8 GEMM over its rows rounded up to 4 (the extra rows are the next groups',
// rewritten by them) or through linear() (K = 72, off cuBLASLt's 16-byte grid). Every row must have
// the bits linear() gives it per group (the sums of neither small-row kernel nor cuBLASLt depend on
// the rows beside them), except
//  - a grouped W8A8 row, which linear() gives cuBLASLt: the same e4m3 activations and scales, the
//    sums in another order, within 2e-3 of the row's largest output (Hopper's fp8 accumulation);
//  - a W8A8 group's last rows past a multiple of 4, which linear() alone gives the direct kernel:
//    within e4m3's activation rounding.
// The rows before the first group stay untouched. K = 128 takes the 16-code path, K = 72 the
// one-code path.
TEST_F(CudaGroupedLinear, Fp8KeptRunsOneGroupedLaunchBitForBit) {
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  for (const bool grouped_gemm : {true, false})
    for (int64_t K : {128, 72}) {
      for (const auto& [rows, first] : {std::pair<std::vector<int64_t>, int64_t>{kMixedRows, 0},
                                        {kMixedRows, 3},
                                        {{1, 2, 8, 9, 16, 3}, 0},
                                        {kOneGroup, 0},
                                        {{5, 18}, 0},
                                        {{70, 3, 33, 129}, 2},
                                        {{200, 150, 9}, 0}}) {
        SCOPED_TRACE(::testing::Message() << "K " << K << ", " << rows.size() << " groups from row " << first
                                          << (grouped_gemm ? ", grouped W8A8" : ", W8A8 per group"));
        gpu_->set_fp8_grouped_gemm(grouped_gemm);
        const int64_t N = 96;
        std::vector<int64_t> offsets{first};
        for (int64_t n : rows) offsets.push_back(offsets.back() + n);
        const int64_t R = offsets.back();
        const std::vector<Matrix> wg = fp8_weights(rows.size(), N, K, static_cast<uint32_t>(K + R));
        std::vector<const Matrix*> pg;
        for (const Matrix& m : wg) pg.push_back(&m);
        const std::vector<float> x = randn(static_cast<size_t>(R * K), static_cast<uint32_t>(R + K), 1.0f);
        const std::vector<float> fill(static_cast<size_t>(R * N), kUntouched);
        float* xg = up(*gpu_, x);
        float* yg = up(*gpu_, fill);
        float* yl = up(*gpu_, fill);
        const int64_t launches = gpu->fp8_grouped_launches(), w8a8 = gpu->fp8_w8a8_linears(),
                      mma = gpu->fp8_grouped_gemm_launches();
        gpu_->grouped_linear(xg, offsets, pg, yg);
        bool small = false;
        int live = 0, big = 0;
        int64_t big_rows = 0;
        for (int64_t n : rows) {
          small = small || (n > 0 && n <= 16);
          live += n > 0;
          big += n > 16;
          big_rows += n > 16 ? n : 0;
        }
        EXPECT_EQ(gpu->fp8_grouped_launches() - launches, small && live > 1 ? 1 : 0);
        // Groups past the direct rows averaging more than 96 rows go one cuBLASLt GEMM each.
        const bool one_launch = grouped_gemm && K % 16 == 0 && big > 1 && live > 1 && big_rows <= 96 * big;
        EXPECT_EQ(gpu->fp8_grouped_gemm_launches() - mma, one_launch ? 1 : 0);
        // The rows linear() would give the direct kernel, and those of the grouped W8A8 launch.
        std::vector<bool> tail(static_cast<size_t>(R), false), in_launch(static_cast<size_t>(R), false);
        int64_t w8a8_groups = 0;
        for (size_t g = 0; g < rows.size(); ++g) {
          const int64_t n = rows[g];
          if (K % 16 != 0 || n <= 16) continue;
          for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) in_launch[static_cast<size_t>(r)] = one_launch;
          ++w8a8_groups;  // alone, or at the buffer's end, through linear(): the same rows as the reference
          if (live < 2 || (!one_launch && offsets[g] + (n + 3) / 4 * 4 > R)) continue;
          for (int64_t r = offsets[g] + n - n % 4; r < offsets[g] + n; ++r) tail[static_cast<size_t>(r)] = true;
        }
        EXPECT_EQ(gpu->fp8_w8a8_linears() - w8a8, one_launch ? 0 : w8a8_groups);
        if (live > 1) {
          const std::string path = gpu_->grouped_linear_path();
          EXPECT_NE(path.find("fp8"), std::string::npos) << path;
          EXPECT_EQ(path.find("one grouped W8A8 launch") != std::string::npos, one_launch) << path;
        }
        for (size_t g = 0; g < rows.size(); ++g)
          if (rows[g] > 0) gpu_->linear(xg + offsets[g] * K, rows[g], wg[g], nullptr, yl + offsets[g] * N);
        const std::vector<float> got = down(*gpu_, static_cast<const float*>(yg), fill.size());
        const std::vector<float> want = down(*gpu_, static_cast<const float*>(yl), fill.size());
        for (int64_t i = 0; i < first * N; ++i) ASSERT_EQ(got[i], kUntouched) << "row " << i / N << " written";
        for (int64_t r = first; r < R; ++r) {
          const float* a = &got[static_cast<size_t>(r * N)];
          const float* b = &want[static_cast<size_t>(r * N)];
          if (!tail[static_cast<size_t>(r)] && !in_launch[static_cast<size_t>(r)]) {
            ASSERT_EQ(std::memcmp(a, b, N * sizeof(float)), 0) << "row " << r;
            continue;
          }
          float scale = 0;
          for (int64_t i = 0; i < N; ++i) scale = std::max(scale, std::fabs(b[i]));
          const float tol = tail[static_cast<size_t>(r)] ? 0.08f * scale : 2e-3f * scale;
          for (int64_t i = 0; i < N; ++i) ASSERT_NEAR(a[i], b[i], tol) << "row " << r << " column " << i;
        }
        for (float* p : {xg, yg, yl}) gpu_->free(p);
      }
    }
  gpu_->set_fp8_grouped_gemm(true);
}

// grouped_linear_routed: the groups' row ranges only in device memory (as an expert permutation
// leaves them), rows past them untouched, one routed launch per call; then the call captured in a
// graph and replayed after the offsets changed on the device, as a captured MoE decode step does.
// Against linear() per group: bit for bit for fp8 weights (the same kernel arithmetic), within
// summation order (1e-5) for bf16 and fp32 (cuBLAS there).
TEST_F(CudaGroupedLinear, RoutedRunsFromDeviceOffsetsAndReplaysInAGraph) {
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  const int64_t N = 96, K = 128, max_rows = 40;
  // Groups of up to 16 rows: linear() reads fp8 codes directly there too.
  const std::vector<std::vector<int32_t>> steps = {{3, 0, 16, 1, 0, 5, 5, 2}, {0, 9, 1, 1, 16, 0, 0, 8}};
  for (const DType dt : {DType::F8_E4M3, DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Matrix> wg;
    if (dt == DType::F8_E4M3) {
      wg = fp8_weights(8, N, K, 5);
    } else {
      for (uint32_t g = 0; g < 8; ++g) wg.push_back(weight(dt, N, K, 300 + g).second);
    }
    std::vector<const Matrix*> pg;
    for (const Matrix& m : wg) pg.push_back(&m);
    const std::vector<float> x = randn(static_cast<size_t>(max_rows * K), 77, 1.0f);
    const std::vector<float> fill(static_cast<size_t>(max_rows * N), kUntouched);
    float* xg = up(*gpu_, x);
    auto* off_g = static_cast<int32_t*>(gpu_->alloc(9 * sizeof(int32_t)));
    float* yg = up(*gpu_, fill);
    float* yl = up(*gpu_, fill);
    // Checks yg against linear() per group for the sizes the device offsets hold now.
    auto expect_per_group = [&](const std::vector<int32_t>& sizes, const char* what) {
      SCOPED_TRACE(what);
      std::vector<int32_t> off{0};
      for (int32_t n : sizes) off.push_back(off.back() + n);
      gpu_->copy_to_device(yl, fill.data(), fill.size() * sizeof(float));
      for (size_t g = 0; g < sizes.size(); ++g)
        if (sizes[g] > 0) gpu_->linear(xg + off[g] * K, sizes[g], wg[g], nullptr, yl + off[g] * N);
      const std::vector<float> got = down(*gpu_, static_cast<const float*>(yg), fill.size());
      const std::vector<float> want = down(*gpu_, static_cast<const float*>(yl), fill.size());
      for (size_t i = 0; i < got.size(); ++i) {
        if (dt == DType::F8_E4M3 || i >= static_cast<size_t>(off.back() * N))
          ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << "element " << i;
        else
          ASSERT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-5) << "element " << i;
      }
    };
    auto set_offsets = [&](const std::vector<int32_t>& sizes) {
      std::vector<int32_t> off{0};
      for (int32_t n : sizes) off.push_back(off.back() + n);
      gpu_->copy_to_device(off_g, off.data(), off.size() * sizeof(int32_t));
      gpu_->copy_to_device(yg, fill.data(), fill.size() * sizeof(float));
    };

    const int64_t launches = gpu->routed_launches();
    // The eager call sizes the workspaces; the captured one counts too.
    eager_then_replayed(
        steps, set_offsets, [&] { gpu_->grouped_linear_routed(xg, max_rows, off_g, pg, yg); }, expect_per_group);
    EXPECT_EQ(gpu->routed_launches() - launches, 2);
    for (void* p : {static_cast<void*>(xg), static_cast<void*>(off_g), static_cast<void*>(yg), static_cast<void*>(yl)})
      gpu_->free(p);
  }
}

// grouped_linear_routed on fp8 weights with more than 16 rows a group on average (a large decode
// batch over few experts): the grouped W8A8 kernel's routed launch, its tiles built on the device.
// Eager and replayed in a graph after the offsets changed on the device, each row has the bits
// grouped_linear's grouped W8A8 launch gives it for the same groups (every group here is past 16
// rows, so all of them go there), and the rows past the groups stay untouched.
TEST_F(CudaGroupedLinear, RoutedFp8ManyRowsRunTheGroupedW8a8Kernel) {
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  const int64_t N = 96, K = 256, G = 4;
  const std::vector<std::vector<int32_t>> steps = {{40, 17, 70, 23}, {0, 90, 30, 25}};
  const std::vector<Matrix> wg = fp8_weights(G, N, K, 9);
  std::vector<const Matrix*> pg;
  for (const Matrix& m : wg) pg.push_back(&m);
  RoutedBuffers r(*gpu_, N, K, 160, G, 78);
  auto expect_grouped = [&](const std::vector<int32_t>& sizes, const char* what) {
    SCOPED_TRACE(what);
    const std::vector<int32_t> off32 = RoutedBuffers::offsets_of(sizes);
    const std::vector<int64_t> off(off32.begin(), off32.end());
    r.clear_reference();
    const int64_t mma = gpu->fp8_grouped_gemm_launches();
    gpu_->grouped_linear(r.x, off, pg, r.yl);
    EXPECT_EQ(gpu->fp8_grouped_gemm_launches() - mma, 1);
    const std::vector<float> got = r.got(), want = r.want();
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    for (size_t i = static_cast<size_t>(off.back() * N); i < got.size(); ++i) ASSERT_EQ(got[i], kUntouched) << i;
  };
  const int64_t routed = gpu->fp8_routed_gemm_launches();
  // The eager call runs the self-check and sizes the workspaces; the captured one counts too.
  eager_then_replayed(
      steps, [&](const std::vector<int32_t>& sizes) { r.set(sizes); },
      [&] { gpu_->grouped_linear_routed(r.x, r.max_rows, r.off, pg, r.y); }, expect_grouped);
  EXPECT_EQ(gpu->fp8_routed_gemm_launches() - routed, 2);
  // At 16 rows a group or fewer on average, the direct kernel's routed launch as before.
  r.set({16, 16, 16, 16});
  gpu_->grouped_linear_routed(r.x, 64, r.off, pg, r.y);
  EXPECT_EQ(gpu->fp8_routed_gemm_launches() - routed, 2);
}

// grouped_linear_routed on bf16 weights with more than 16 rows a group on average: one grouped GEMM
// on bf16 tensor cores from tiles listed on the device (kernels/cuda/bf16_grouped_gemm_mma.h),
// eager and replayed in a graph after the offsets changed on the device. Each row equals linear()
// per group (cuBLAS, fp32 output) to summation order, and the direct kernel's result (with the
// grouped GEMM off, as bench-moe --routed-gemm direct) likewise; the rows past the groups stay
// untouched. At 16 rows a group or fewer on average the direct kernel runs.
TEST_F(CudaGroupedLinear, RoutedBf16ManyRowsRunTheGroupedGemm) {
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  const int64_t N = 200, K = 264, G = 4;  // N and K off the kernel's tiles and steps
  const std::vector<std::vector<int32_t>> steps = {{40, 17, 70, 23}, {0, 90, 30, 25}, {1, 0, 65, 66}};
  std::vector<Matrix> wg;
  for (uint32_t g = 0; g < G; ++g) wg.push_back(weight(DType::BF16, N, K, 500 + g).second);
  std::vector<const Matrix*> pg;
  for (const Matrix& m : wg) pg.push_back(&m);
  RoutedBuffers r(*gpu_, N, K, 170, G, 79);
  auto expect_per_group = [&](const std::vector<int32_t>& sizes, const char* what) {
    SCOPED_TRACE(what);
    const std::vector<int32_t> off = RoutedBuffers::offsets_of(sizes);
    r.clear_reference();
    for (size_t g = 0; g < sizes.size(); ++g)
      if (sizes[g] > 0) gpu_->linear(r.x + off[g] * K, sizes[g], wg[g], nullptr, r.yl + off[g] * N);
    const std::vector<float> got = r.got(), want = r.want();
    for (size_t i = 0; i < got.size(); ++i) {
      if (i >= static_cast<size_t>(off.back() * N))
        ASSERT_EQ(got[i], kUntouched) << "element " << i;
      else
        ASSERT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-5) << "element " << i;
    }
  };
  auto set = [&](const std::vector<int32_t>& sizes) { r.set(sizes); };
  const int64_t mma = gpu->bf16_routed_gemm_launches();
  eager_then_replayed(
      steps, set, [&] { gpu_->grouped_linear_routed(r.x, r.max_rows, r.off, pg, r.y); }, expect_per_group);
  EXPECT_EQ(gpu->bf16_routed_gemm_launches() - mma, 2);
  EXPECT_NE(gpu->routed_linear_path().find("grouped bf16 GEMM on bf16 tensor cores"), std::string::npos)
      << gpu->routed_linear_path();
  // Off: the direct kernel, the same values to summation order.
  gpu->set_routed_grouped_gemm(false);
  r.set(steps[0]);
  gpu_->grouped_linear_routed(r.x, r.max_rows, r.off, pg, r.y);
  expect_per_group(steps[0], "direct kernel");
  EXPECT_EQ(gpu->bf16_routed_gemm_launches() - mma, 2);
  EXPECT_NE(gpu->routed_linear_path().find("direct kernel"), std::string::npos) << gpu->routed_linear_path();
  gpu->set_routed_grouped_gemm(true);
  // At 16 rows a group or fewer on average, the direct kernel.
  r.set({16, 16, 16, 16});
  gpu_->grouped_linear_routed(r.x, 64, r.off, pg, r.y);
  expect_per_group({16, 16, 16, 16}, "16 rows a group");
  EXPECT_EQ(gpu->bf16_routed_gemm_launches() - mma, 2);
}

// The grouped GEMMs' products (CudaBackend::grouped_gemm_core): on an sm_90 device wgmma, after a
// self-check against mma.sync before the first use; set off (--grouped-gemm-core mma-sync),
// mma.sync. Both give the routed bf16 and the grouped W8A8 experts' rows to summation order (the
// bf16 and fp8 products exact in fp32 either way), and the paths name the core that ran.
class CudaGroupedGemmCore : public CudaGroupedLinear {
 protected:
  static constexpr int64_t kN = 200, kNq = 96, kK = 256;

  // The routed bf16 GEMM's rows (groups of 40, 17, 70 and 23: all past the direct kernel's 16) and
  // the grouped W8A8 GEMM's on fp8 weights, each checked to have run on the core the backend names.
  void run(std::vector<float>* bf16_rows, std::vector<float>* fp8_rows) {
    auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
    ASSERT_NE(gpu, nullptr);
    const std::vector<int32_t> sizes = {40, 17, 70, 23};
    if (fp8_.empty()) {
      fp8_ = fp8_weights(sizes.size(), kNq, kK, 13);
      for (uint32_t g = 0; g < sizes.size(); ++g) bf16_.push_back(weight(DType::BF16, kN, kK, 600 + g).second);
    }
    std::vector<int32_t> off32 = {0};
    for (int32_t n : sizes) off32.push_back(off32.back() + n);
    const int64_t R = off32.back();
    ComputeBackend& b = *gpu_;
    float* xg = up(b, randn(static_cast<size_t>(R * kK), 81, 1.0f));
    auto* offg = static_cast<int32_t*>(b.alloc(off32.size() * sizeof(int32_t)));
    b.copy_to_device(offg, off32.data(), off32.size() * sizeof(int32_t));
    float* y = up(b, std::vector<float>(static_cast<size_t>(R * kN), kUntouched));
    float* y8 = up(b, std::vector<float>(static_cast<size_t>(R * kNq), kUntouched));
    std::vector<const Matrix*> pb, pf;
    for (size_t g = 0; g < sizes.size(); ++g) {
      pb.push_back(&bf16_[g]);
      pf.push_back(&fp8_[g]);
    }
    const int64_t routed = gpu->bf16_routed_gemm_launches(), grouped = gpu->fp8_grouped_gemm_launches(),
                  wgmma = gpu->wgmma_gemm_launches();
    b.grouped_linear_routed(xg, R, offg, pb, y);
    EXPECT_EQ(gpu->bf16_routed_gemm_launches() - routed, 1);
    EXPECT_NE(gpu->routed_linear_path().find("(" + gpu->grouped_gemm_core() + ")"), std::string::npos)
        << gpu->routed_linear_path();
    b.grouped_linear(xg, std::vector<int64_t>(off32.begin(), off32.end()), pf, y8);
    EXPECT_EQ(gpu->fp8_grouped_gemm_launches() - grouped, 1);
    EXPECT_NE(b.grouped_linear_path().find("e4m3 on " + gpu->grouped_gemm_core()), std::string::npos)
        << b.grouped_linear_path();
    // Both GEMMs (and a first W8A8 self-check's grouped run) on wgmma, or none.
    if (gpu->grouped_gemm_core() == "wgmma")
      EXPECT_GE(gpu->wgmma_gemm_launches() - wgmma, 2);
    else
      EXPECT_EQ(gpu->wgmma_gemm_launches() - wgmma, 0);
    *bf16_rows = down(b, static_cast<const float*>(y), static_cast<size_t>(R * kN));
    *fp8_rows = down(b, static_cast<const float*>(y8), static_cast<size_t>(R * kNq));
    for (void* p : {static_cast<void*>(xg), static_cast<void*>(offg), static_cast<void*>(y), static_cast<void*>(y8)})
      b.free(p);
  }

  std::vector<Matrix> fp8_, bf16_;
};

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float rel, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  float scale = 0;
  for (float v : b) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], rel * scale) << what << " element " << i;
}

TEST_F(CudaGroupedGemmCore, RunsOnWgmmaWhereTheGpuHasIt) {
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  std::vector<float> bw, fw, bm, fm;
  const bool hopper = test::gpu_is_hopper();
  EXPECT_EQ(gpu->grouped_gemm_core(), hopper ? "wgmma" : "mma.sync");
  run(&bw, &fw);
  EXPECT_EQ(gpu->grouped_gemm_core(), hopper ? "wgmma" : "mma.sync");  // the self-check agreed
  gpu->set_grouped_gemm_wgmma(false);
  EXPECT_EQ(gpu->grouped_gemm_core(), "mma.sync");
  run(&bm, &fm);
  gpu->set_grouped_gemm_wgmma(true);
  expect_close(bw, bm, 1e-5f, "bf16");
  expect_close(fw, fm, 2e-3f, "fp8");  // Hopper's fp8 tensor cores keep about 14 bits within a block
}

// A tensor core that reads the operands' shared memory otherwise than the wgmma kernels lay it out
// (the emulation's SHARDLM_EMU_WGMMA_UNSWIZZLED) fails the self-check: the grouped GEMMs run on
// mma.sync from the first call, with mma.sync's bits, and stay there.
TEST_F(CudaGroupedGemmCore, WgmmaTurnsOffWhenItsSelfCheckDisagrees) {
#ifndef SHARDLM_CUDA_EMULATION
  GTEST_SKIP() << "needs the emulated tensor core's misreading switch";
#else
  auto* gpu = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(gpu, nullptr);
  std::vector<float> bw, fw, bm, fm;
  {
    struct Env {
      Env() { setenv("SHARDLM_EMU_WGMMA_UNSWIZZLED", "1", 1); }
      ~Env() { unsetenv("SHARDLM_EMU_WGMMA_UNSWIZZLED"); }
    } env;
    EXPECT_EQ(gpu->grouped_gemm_core(), "wgmma");
    run(&bw, &fw);
    EXPECT_EQ(gpu->grouped_gemm_core(), "mma.sync");
  }
  // The verdict stands once the tensor core reads right again.
  run(&bm, &fm);
  EXPECT_EQ(gpu->grouped_gemm_core(), "mma.sync");
  EXPECT_EQ(std::memcmp(bw.data(), bm.data(), bw.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(fw.data(), fm.data(), fw.size() * sizeof(float)), 0);
#endif
}

}  // namespace
}  // namespace shardlm
