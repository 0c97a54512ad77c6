// kernels/cuda/rows_matmul (a linear over a few rows read straight from the weights; fp8 e4m3
// weights with block scales dequantised as they are read) against its CPU reference: the weights dequantised by
// model/fp8_block.h (the host's exact bf16 values), the bf16 activations, products summed in double. Tolerance: the
// bound of fp32 accumulation of exact products, (K / 32 + 8) 2^-24 of sum |x w| per output. Also bit for bit: a row's
// result does not depend on the other rows of the call (M = 1 against M up to 40), and the 16-byte path and the
// one-code path agree with the reference on every code (NaN codes, large scales, and products
// that round past the largest bf16 to infinity). The device-routed grouped call: fp8 groups get the single-weight
// launch's bits, bf16 and fp32 groups the reference within the same bound, from row ranges that exist only in device
// memory (empty groups, more than one block of the pass scan, rows past the groups left alone). The grouped W8A8 GEMM
// on fp8 tensor cores (kernels/cuda/fp8_grouped_gemm_mma): its m16n8k32 fragment layout exactly, and its groups against
// the block-scaled sum in double (see check_grouped_gemm), its routed launch (tiles built on the device from the
// groups' offsets) bit for bit the listed one. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/backend_data.h"
#include "common/gpu.h"
#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"

#ifdef SHARDLM_HAVE_CUDA
#include "cpu/fp8_act_quant.h"
#include "cuda/device_buffer.h"
#include "cuda/fp8_grouped_gemm_mma.h"
#include "cuda/mma_fp8_tile.h"
#include "cuda/rows_matmul.h"
#include "cuda/wgmma_tile.h"
#include "bf16_bits.h"
#include "fp8_bits.h"
#endif

namespace shardlm {
namespace {

#ifdef SHARDLM_HAVE_CUDA
using test::DeviceBuffer;

// A [R, C] fp8 weight with [ceil(R / br), ceil(C / bc)] scales and the slice [r0, r0 + N) x
// [c0, c0 + K) of it that a kernel call sees.
struct Case {
  int64_t R, C, br, bc, r0, N, c0, K;
};

struct Fp8Data {
  std::vector<uint8_t> q;
  std::vector<float> scales;
};

Fp8Data random_fp8(const Case& c, uint32_t seed, bool nan_codes, float big_scale) {
  std::mt19937 g(seed);
  Fp8Data d;
  d.q.resize(static_cast<size_t>(c.R * c.C));
  for (auto& b : d.q) {
    b = static_cast<uint8_t>(g() & 0xff);
    if (!nan_codes && (b & 0x7f) == 0x7f) b ^= 0x01;
  }
  const int64_t sr = (c.R + c.br - 1) / c.br, sc = (c.C + c.bc - 1) / c.bc;
  std::normal_distribution<float> n(0.0f, 1.0f);
  d.scales.resize(static_cast<size_t>(sr * sc));
  // Scales as checkpoints have them (amax / 448 of small weights), some tiny enough that products
  // land on fp32 subnormals.
  for (auto& s : d.scales) s = std::ldexp(1.0f + 0.5f * std::fabs(n(g)), -static_cast<int>(g() % 14) - 4);
  if (!d.scales.empty()) d.scales[0] = 1e-39f;  // an fp32 subnormal scale
  if (big_scale > 0 && d.scales.size() > 1) d.scales[1] = big_scale;
  return d;
}

TensorView view(const char* name, DType dt, std::vector<int64_t> shape, const void* p, size_t n) {
  return test::tensor_view(name, dt, std::move(shape), p, n);
}

// The reference: y[m, n] = sum_k bf16(x[m, k]) * w(n, k) in double; also sum |x w| per output.
void reference(const Case& c, const Fp8Data& d, const std::vector<uint16_t>& xb, int64_t M, std::vector<double>* y,
               std::vector<double>* mag) {
  const TensorView tw = view("w", DType::F8_E4M3, {c.R, c.C}, d.q.data(), d.q.size());
  const TensorView ts = view("w_scale_inv", DType::F32, {(c.R + c.br - 1) / c.br, (c.C + c.bc - 1) / c.bc},
                             d.scales.data(), d.scales.size() * 4);
  std::vector<uint16_t> w(static_cast<size_t>(c.N * c.K));
  dequant_fp8_block(tw, ts, c.br, c.bc, c.r0, c.N, c.c0, c.K, w.data());
  y->assign(static_cast<size_t>(M * c.N), 0.0);
  mag->assign(y->size(), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = double(bf16_to_f32(xb[m * c.K + k])) * double(bf16_to_f32(w[n * c.K + k]));
        s += p;
        a += std::fabs(p);
      }
      (*y)[m * c.N + n] = s;
      (*mag)[m * c.N + n] = a;
    }
}

// The slice's codes packed and the scales of the blocks it touches, on the device, as CudaBackend
// keeps a tensor-parallel slice.
struct DeviceWeight {
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  cuda::Fp8Weight w;
};

DeviceWeight upload(const Case& c, const Fp8Data& d) {
  std::vector<uint8_t> packed(static_cast<size_t>(c.N * c.K));
  for (int64_t n = 0; n < c.N; ++n)
    std::memcpy(&packed[n * c.K], &d.q[(c.r0 + n) * c.C + c.c0], static_cast<size_t>(c.K));
  const TensorView ts = view("w_scale_inv", DType::F32, {(c.R + c.br - 1) / c.br, (c.C + c.bc - 1) / c.bc},
                             d.scales.data(), d.scales.size() * 4);
  const Fp8SliceScales s = fp8_slice_scales(ts, c.br, c.bc, c.r0, c.N, c.c0, c.K);
  DeviceWeight dw{DeviceBuffer<uint8_t>(packed), DeviceBuffer<float>(s.scales), {}};
  dw.w.codes = dw.codes.get();
  dw.w.scale_inv = dw.scales.get();
  dw.w.N = c.N;
  dw.w.K = c.K;
  dw.w.scale_cols = s.cols;
  dw.w.block_rows = c.br;
  dw.w.block_cols = c.bc;
  dw.w.row_off = c.r0 % c.br;
  dw.w.col_off = c.c0 % c.bc;
  return dw;
}

std::vector<uint16_t> random_x(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(n));
  for (auto& v : x) v = f32_to_bf16(d(g));
  return x;
}

std::vector<float> run(const DeviceWeight& dw, const std::vector<uint16_t>& xb, int64_t M) {
  DeviceBuffer<uint16_t> dx(xb);
  DeviceBuffer<float> dy(static_cast<size_t>(M * dw.w.N));
  cuda::launch_fp8_matmul(dx.get(), M, dw.w, dy.get(), nullptr);
  test::cuda_sync("fp8_matmul");
  return dy.download();
}

void check(const Case& c, bool vectorised, uint32_t seed, bool nan_codes = false, float big_scale = 0) {
  SCOPED_TRACE(::testing::Message() << "weight [" << c.R << ", " << c.C << "] blocks " << c.br << "x" << c.bc
                                    << " slice rows " << c.r0 << "+" << c.N << " cols " << c.c0 << "+" << c.K);
  const Fp8Data d = random_fp8(c, seed, nan_codes, big_scale);
  const DeviceWeight dw = upload(c, d);
  constexpr int64_t kMaxM = 40;
  const std::vector<uint16_t> xb = random_x(kMaxM * c.K, seed + 1);
  {
    DeviceBuffer<uint16_t> dx(xb);
    ASSERT_EQ(cuda::fp8_matmul_vectorised(dw.w, dx.get()), vectorised);
  }
  std::vector<double> want, mag;
  reference(c, d, xb, kMaxM, &want, &mag);
  const std::vector<float> all = run(dw, xb, kMaxM);
  // A lane adds K / 32 exact products in sequence, then five butterfly adds: each add rounds by at
  // most 2^-24 of the running magnitude.
  const double tol = (static_cast<double>(c.K) / 32 + 8) * std::ldexp(1.0, -24);
  for (int64_t i = 0; i < kMaxM * c.N; ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(all[i])) << "output " << i;
      continue;
    }
    // Past the largest float the fp32 sums overflow where the double ones need not: such outputs
    // are held only to the batch invariance below, which compares the 1-row kernel's rounding (a
    // conversion) with the 8-row kernel's (integer adds) bit for bit.
    if (mag[i] > std::numeric_limits<float>::max()) continue;
    ASSERT_NEAR(all[i], want[i], tol * mag[i] + 1e-30) << "row " << i / c.N << " output " << i % c.N;
  }
  // Batch invariance: every row count gives each row the bits it gets alone (a NaN is a NaN: which
  // lane's NaN the butterfly ends with, and so its sign, follows the lane that writes it).
  for (int64_t M : {1, 2, 3, 5, 8, 9, 16, 17}) {
    const std::vector<float> part = run(dw, xb, M);
    for (size_t i = 0; i < part.size(); ++i) {
      if (std::isnan(all[i])) {
        ASSERT_TRUE(std::isnan(part[i])) << "M = " << M << " output " << i;
        continue;
      }
      ASSERT_EQ(std::memcmp(&part[i], &all[i], sizeof(float)), 0) << "M = " << M << " output " << i;
    }
  }
}

// ---- Device-routed grouped call ----

// Group sizes as a decode step's routing makes them: empty groups, single rows, pass edges.
std::vector<int32_t> routed_offsets(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> off = {0};
  for (int32_t n : sizes) off.push_back(off.back() + n);
  return off;
}

// y [max_rows, N] from launch_routed_matmul, every element first set to a sentinel.
std::vector<float> run_routed(const void* x, int64_t max_rows, const std::vector<int32_t>& offsets,
                              const std::vector<cuda::RoutedWeight>& table, const cuda::Fp8Weight& shape,
                              cuda::RowsWeight format, bool vectorised, float sentinel) {
  const int64_t G = static_cast<int64_t>(table.size());
  DeviceBuffer<int32_t> d_off(offsets);
  DeviceBuffer<cuda::RoutedWeight> d_table(table);
  DeviceBuffer<cuda::Fp8MatmulPass> passes(static_cast<size_t>(cuda::routed_matmul_max_passes(max_rows, G)));
  DeviceBuffer<int32_t> count(1);
  DeviceBuffer<float> y(std::vector<float>(static_cast<size_t>(max_rows * shape.N), sentinel));
  cuda::launch_routed_matmul(x, max_rows, d_off.get(), G, d_table.get(), shape, format, vectorised, passes.get(),
                             count.get(), y.get(), nullptr);
  test::cuda_sync("routed_matmul");
  return y.download();
}

void check_routed_fp8(const Case& c, bool vectorised, const std::vector<int32_t>& sizes, int64_t slack) {
  SCOPED_TRACE(::testing::Message() << "K " << c.K << " groups " << sizes.size());
  const std::vector<int32_t> off = routed_offsets(sizes);
  const int64_t rows = off.back(), max_rows = rows + slack;
  std::vector<DeviceWeight> ws;
  std::vector<cuda::RoutedWeight> table;
  for (size_t g = 0; g < sizes.size(); ++g)
    ws.push_back(upload(c, random_fp8(c, 100 + static_cast<uint32_t>(g), false, 0)));
  for (const DeviceWeight& dw : ws) table.push_back({dw.codes.get(), dw.scales.get()});
  const std::vector<uint16_t> xb = random_x(max_rows * c.K, 7);
  DeviceBuffer<uint16_t> dx(xb);
  for (const DeviceWeight& dw : ws)
    ASSERT_EQ(cuda::routed_matmul_vectorised(dw.w, cuda::RowsWeight::kFp8, dw.codes.get(), dx.get()), vectorised);
  const float sentinel = -12345.0f;
  const std::vector<float> y =
      run_routed(dx.get(), max_rows, off, table, ws[0].w, cuda::RowsWeight::kFp8, vectorised, sentinel);
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] == 0) continue;
    const std::vector<uint16_t> xg(xb.begin() + off[g] * c.K, xb.begin() + off[g + 1] * c.K);
    const std::vector<float> want = run(ws[g], xg, sizes[g]);
    ASSERT_EQ(std::memcmp(want.data(), &y[off[g] * c.N], want.size() * sizeof(float)), 0) << "group " << g;
  }
  for (int64_t i = rows * c.N; i < max_rows * c.N; ++i) ASSERT_EQ(y[i], sentinel) << "row " << i / c.N;
}

// bf16 or fp32 weights [N, K] per group, against sums in double within the fp32 accumulation bound.
void check_routed_plain(cuda::RowsWeight format, int64_t N, int64_t K, const std::vector<int32_t>& sizes, int64_t slack,
                        bool vectorised) {
  SCOPED_TRACE(::testing::Message() << (format == cuda::RowsWeight::kBf16 ? "bf16" : "fp32") << " N " << N << " K " << K
                                    << " groups " << sizes.size());
  const bool bf16 = format == cuda::RowsWeight::kBf16;
  const std::vector<int32_t> off = routed_offsets(sizes);
  const int64_t G = static_cast<int64_t>(sizes.size()), rows = off.back(), max_rows = rows + slack;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Values that bf16 holds exactly, so the one host array serves both formats.
  auto draw = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& f : v) f = bf16_to_f32(f32_to_bf16(nd(gen)));
    return v;
  };
  const std::vector<float> w = draw(static_cast<size_t>(G * N * K)), x = draw(static_cast<size_t>(max_rows * K));
  std::vector<uint16_t> wb(w.size()), xb(x.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  DeviceBuffer<float> dw(w), dx(x);
  DeviceBuffer<uint16_t> dwb(wb), dxb(xb);
  const size_t esize = bf16 ? 2 : 4;
  const auto* wbase = bf16 ? static_cast<const char*>(static_cast<const void*>(dwb.get()))
                           : static_cast<const char*>(static_cast<const void*>(dw.get()));
  const void* xdev = bf16 ? static_cast<const void*>(dxb.get()) : static_cast<const void*>(dx.get());
  std::vector<cuda::RoutedWeight> table;
  for (int64_t g = 0; g < G; ++g) table.push_back({wbase + g * N * K * esize, nullptr});
  cuda::Fp8Weight shape;
  shape.N = N;
  shape.K = K;
  for (const auto& t : table) ASSERT_EQ(cuda::routed_matmul_vectorised(shape, format, t.weight, xdev), vectorised);
  const float sentinel = 777.0f;
  const std::vector<float> y = run_routed(xdev, max_rows, off, table, shape, format, vectorised, sentinel);
  const double tol = (static_cast<double>(K) / 32 + 8) * std::ldexp(1.0, -24);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = off[g]; r < off[g + 1]; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double want = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = double(x[r * K + k]) * double(w[(g * N + n) * K + k]);
          want += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[r * N + n], want, tol * mag + 1e-30) << "group " << g << " row " << r << " output " << n;
      }
  for (int64_t i = rows * N; i < max_rows * N; ++i) ASSERT_EQ(y[i], sentinel) << "row " << i / N;
}

// ---- Grouped W8A8 GEMM on fp8 tensor cores ----

// Integer-valued codes (-8..8, exact in e4m3) and an integer accumulator: every sum is exact on
// any tensor core, so a fragment element read from the wrong place is an exact mismatch.
void check_mma_fp8_tile() {
  std::mt19937 g(31);
  auto code = [&] { return fp8_bits::from_f32(static_cast<float>(static_cast<int>(g() % 17) - 8)); };
  std::vector<uint8_t> a(16 * 32), b(8 * 32);
  for (auto& v : a) v = code();
  for (auto& v : b) v = code();
  std::vector<float> c(16 * 8), want(16 * 8);
  for (auto& v : c) v = static_cast<float>(static_cast<int>(g() % 201) - 100);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double sum = c[r * 8 + n];
      for (int k = 0; k < 32; ++k) sum += double(fp8_bits::to_f32(a[r * 32 + k])) * fp8_bits::to_f32(b[n * 32 + k]);
      want[r * 8 + n] = static_cast<float>(sum);
    }
  DeviceBuffer<uint8_t> d_a(a), d_b(b);
  DeviceBuffer<float> d_c(c), d_d(std::vector<float>(want.size(), std::nanf("")));
  cuda::mma_fp8_tile(d_a.get(), d_b.get(), d_c.get(), d_d.get(), nullptr);
  test::cuda_sync("mma_fp8_tile");
  const std::vector<float> got = d_d.download();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "row " << i / 8 << " column " << i % 8;
}

// One wgmma product (wgmma_tile.h) at every 32-byte k-slice of 128-byte rows, bf16 and e4m3, against
// the host product: small integers (and quarters), so every sum is exact and the comparison is too.
void check_wgmma_tile() {
  std::mt19937 g(37);
  std::vector<uint8_t> a(64 * 128), b(64 * 128);
  for (const bool fp8 : {false, true}) {
    if (fp8) {
      for (auto& v : a) v = fp8_bits::from_f32(static_cast<float>(static_cast<int>(g() % 17) - 8));
      for (auto& v : b) v = fp8_bits::from_f32(static_cast<float>(static_cast<int>(g() % 9) - 4) / 4.0f);
    } else {
      for (size_t i = 0; i < a.size(); i += 2) {
        const uint16_t x = bf16_bits::from_f32(static_cast<float>(static_cast<int>(g() % 17) - 8));
        const uint16_t y = bf16_bits::from_f32(static_cast<float>(static_cast<int>(g() % 9) - 4) / 4.0f);
        std::memcpy(&a[i], &x, 2);
        std::memcpy(&b[i], &y, 2);
      }
    }
    auto value = [&](const std::vector<uint8_t>& m, int r, int byte) {
      if (fp8) return fp8_bits::to_f32(m[r * 128 + byte]);
      uint16_t x;
      std::memcpy(&x, &m[r * 128 + byte], 2);
      return bf16_bits::to_f32(x);
    };
    DeviceBuffer<uint8_t> d_a(a), d_b(b);
    for (int kk = 0; kk < 128; kk += 32) {
      SCOPED_TRACE(::testing::Message() << (fp8 ? "e4m3" : "bf16") << ", k-slice at byte " << kk);
      DeviceBuffer<float> d_d(std::vector<float>(64 * 64, std::nanf("")));
      cuda::wgmma_tile(d_a.get(), d_b.get(), kk, fp8, d_d.get(), nullptr);
      test::cuda_sync("wgmma_tile");
      const std::vector<float> got = d_d.download();
      const int step = fp8 ? 1 : 2;
      for (int r = 0; r < 64; ++r)
        for (int n = 0; n < 64; ++n) {
          double want = 0;
          for (int k = kk; k < kk + 32; k += step) want += double(value(a, r, k)) * value(b, n, k);
          ASSERT_EQ(got[r * 64 + n], static_cast<float>(want)) << "D[" << r << "][" << n << "]";
        }
    }
  }
}

// Groups of `sizes` rows after `first` rows no group covers, each with its own weight (a slice
// `c` of a random fp8 matrix); the activations quantised on the host (kernels/cpu/fp8_act_quant.h,
// the device kernel's bits). Against the block-scaled sum in double: the code products are exact,
// so only the tensor cores' sums within a block and the fp32 promotion round, bounded by 2e-3 of
// sum |terms| (Hopper keeps about 14 bits within a block; the emulation rounds far less). Rows
// before the first group are left alone.
void check_grouped_gemm(const Case& c, const std::vector<int64_t>& sizes, int64_t first,
                        cuda::GemmCore core = cuda::GemmCore::kMmaSync) {
  SCOPED_TRACE(::testing::Message() << (core == cuda::GemmCore::kWgmma ? "wgmma" : "mma.sync") << ", weight [" << c.R
                                    << ", " << c.C << "] slice rows " << c.r0 << "+" << c.N << " cols " << c.c0 << "+"
                                    << c.K << ", " << sizes.size() << " groups");
  std::vector<int64_t> off = {first};
  for (int64_t n : sizes) off.push_back(off.back() + n);
  const int64_t R = off.back(), L = (c.K + 127) / 128;
  std::vector<Fp8Data> data;
  std::vector<DeviceWeight> ws;
  for (size_t g = 0; g < sizes.size(); ++g) {
    data.push_back(random_fp8(c, 200 + static_cast<uint32_t>(g), false, 0));
    ws.push_back(upload(c, data.back()));
  }
  ASSERT_TRUE(cuda::fp8_grouped_gemm_mma_fits(ws[0].w));
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(R * c.K));
  for (auto& v : x) v = nd(gen);
  std::vector<uint8_t> q(x.size());
  std::vector<float> qs(static_cast<size_t>(std::max<int64_t>(L * R, 1)));
  cpu::fp8_act_quant(x.data(), R, c.K, q.data(), qs.data(), R);
  std::vector<cuda::Fp8GemmTile> tiles;
  for (size_t g = 0; g < sizes.size(); ++g)
    for (int64_t m0 = 0; m0 < sizes[g]; m0 += cuda::kFp8GemmTileRows)
      tiles.push_back({ws[g].codes.get(), ws[g].scales.get(), off[g] + m0,
                       static_cast<int32_t>(std::min<int64_t>(cuda::kFp8GemmTileRows, sizes[g] - m0)), 0});
  const float sentinel = -4321.0f;
  DeviceBuffer<uint8_t> dq(q);
  DeviceBuffer<float> dqs(qs), dy(std::vector<float>(static_cast<size_t>(R * c.N), sentinel));
  DeviceBuffer<cuda::Fp8GemmTile> dt(tiles);
  cuda::launch_fp8_grouped_gemm_mma(dq.get(), dqs.get(), R, dt.get(), static_cast<int64_t>(tiles.size()), ws[0].w,
                                    dy.get(), nullptr, core);
  test::cuda_sync("fp8_grouped_gemm_mma");
  const std::vector<float> y = dy.download();
  for (int64_t i = 0; i < first * c.N; ++i) ASSERT_EQ(y[i], sentinel) << "row " << i / c.N << " written";
  {
    // The routed launch from the same offsets on the device, over 7 rows more than the groups
    // hold: the listed launch's bits, the rows outside the groups untouched.
    const int64_t max_rows = R + 7;
    std::vector<uint8_t> q7(q);
    q7.resize(static_cast<size_t>(max_rows * c.K), 0);
    std::vector<float> qs7(static_cast<size_t>(L * max_rows), 1.0f);
    for (int64_t b = 0; b < L; ++b)
      for (int64_t r = 0; r < R; ++r) qs7[b * max_rows + r] = qs[b * R + r];
    std::vector<cuda::RoutedWeight> table;
    for (const DeviceWeight& w : ws) table.push_back({w.codes.get(), w.scales.get()});
    const std::vector<int32_t> off32(off.begin(), off.end());
    const int64_t max_tiles = cuda::fp8_routed_gemm_max_tiles(max_rows, static_cast<int64_t>(sizes.size()));
    DeviceBuffer<uint8_t> dq7(q7);
    DeviceBuffer<float> dqs7(qs7), dy7(std::vector<float>(static_cast<size_t>(max_rows * c.N), sentinel));
    DeviceBuffer<int32_t> doff(off32), dcount(1);
    DeviceBuffer<cuda::RoutedWeight> dtable(table);
    DeviceBuffer<cuda::Fp8GemmTile> dtiles(static_cast<size_t>(max_tiles));
    cuda::launch_fp8_routed_gemm_mma(dq7.get(), dqs7.get(), max_rows, max_rows, doff.get(),
                                     static_cast<int64_t>(sizes.size()), dtable.get(), ws[0].w, dtiles.get(),
                                     dcount.get(), dy7.get(), nullptr, core);
    test::cuda_sync("fp8_routed_gemm_mma");
    const std::vector<float> y7 = dy7.download();
    EXPECT_EQ(dcount.download()[0], static_cast<int32_t>(tiles.size()));
    ASSERT_EQ(std::memcmp(y7.data(), y.data(), y.size() * sizeof(float)), 0) << "routed against listed";
    for (size_t i = y.size(); i < y7.size(); ++i) ASSERT_EQ(y7[i], sentinel) << "row " << i / c.N << " written";
  }
  const int64_t sr = (c.R + c.br - 1) / c.br, sc = (c.C + c.bc - 1) / c.bc;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const Fp8Data& d = data[g];
    for (int64_t r = off[g]; r < off[g + 1]; ++r)
      for (int64_t n = 0; n < c.N; ++n) {
        double want = 0, mag = 0;
        for (int64_t b = 0; b < L; ++b) {
          double part = 0, part_mag = 0;
          for (int64_t k = 128 * b; k < std::min(c.K, 128 * b + 128); ++k) {
            const double p =
                double(fp8_bits::to_f32(q[r * c.K + k])) * fp8_bits::to_f32(d.q[(c.r0 + n) * c.C + c.c0 + k]);
            part += p;
            part_mag += std::fabs(p);
          }
          ASSERT_LT((c.r0 + n) / c.br, sr);
          const double s = double(qs[b * R + r]) * d.scales[((c.r0 + n) / c.br) * sc + (c.c0 + 128 * b) / c.bc];
          want += part * s;
          mag += part_mag * std::fabs(s);
        }
        ASSERT_NEAR(y[r * c.N + n], want, 2e-3 * mag + 1e-30) << "group " << g << " row " << r << " output " << n;
      }
  }
}
#endif

TEST(CudaRoutedMatmul, Fp8GroupsGetTheSingleWeightBits) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  // Empty groups, one row, a pass and one more, several passes; rows past the groups untouched.
  const std::vector<int32_t> sizes = {0, 1, 8, 9, 0, 3, 17, 2, 0};
  check_routed_fp8({150, 256, 128, 128, 20, 100, 0, 256}, true, sizes, 5);
  check_routed_fp8({40, 200, 128, 128, 0, 40, 0, 200}, false, sizes, 0);
#endif
}

TEST(CudaRoutedMatmul, Bf16AndFp32GroupsMatchReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_routed_plain(cuda::RowsWeight::kBf16, 24, 128, {2, 0, 9, 1, 16, 0, 5}, 3, true);
  check_routed_plain(cuda::RowsWeight::kF32, 24, 128, {2, 0, 9, 1, 16, 0, 5}, 3, true);
  check_routed_plain(cuda::RowsWeight::kBf16, 10, 40, {3, 0, 12}, 2, false);
  check_routed_plain(cuda::RowsWeight::kF32, 10, 40, {3, 0, 12}, 0, false);
  // More groups than the pass scan's block (256 threads): a decode step over 300 experts.
  std::vector<int32_t> many(300);
  for (size_t g = 0; g < many.size(); ++g) many[g] = static_cast<int32_t>((g * 7) % 5 == 0 ? 0 : (g * 13) % 4 + 1);
  check_routed_plain(cuda::RowsWeight::kBf16, 8, 32, many, 4, true);
#endif
}

TEST(CudaFp8Matmul, SixteenCodePathMatchesReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  // DeepSeek-V3's 128 x 128 blocks on a tensor-parallel slice starting inside a row block; a
  // 64-wide grid with a column slice on it; an N that is not a multiple of a block's 8 outputs.
  check({300, 512, 128, 128, 100, 150, 0, 512}, true, 1);
  check({64, 768, 64, 64, 0, 64, 128, 384}, true, 2);
  check({37, 96, 16, 32, 0, 37, 0, 96}, true, 3);
#endif
}

TEST(CudaFp8Matmul, OneCodePathMatchesReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  // K not a multiple of 16; a column slice off the 16-grid; blocks that are not a power of two.
  check({40, 200, 128, 128, 0, 40, 0, 200}, false, 4);
  check({70, 256, 32, 64, 3, 50, 37, 100}, false, 5);
  check({48, 96, 24, 48, 0, 48, 0, 96}, false, 6);
#endif
}

TEST(CudaFp8Matmul, NanCodesAndLargeScalesKeepTheHostValues) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  // NaN codes make their outputs NaN; scales of 2^8 and more (the integer dequantisation once
  // took another path for them).
  check({16, 256, 16, 128, 0, 16, 0, 256}, true, 7, /*nan_codes=*/true);
  check({32, 256, 16, 128, 0, 32, 0, 256}, true, 8, false, /*big_scale=*/300.0f);
  check({32, 100, 16, 50, 0, 32, 0, 100}, false, 9, false, 3.0e5f);
  // 448 * 7.59e35 = 3.4003e38: finite in fp32, past the largest bf16 (3.3895e38) by more than half
  // its last step, so infinity in bf16, as the host rounds it, whichever way the kernel rounds.
  check({32, 256, 16, 128, 0, 32, 0, 256}, true, 10, false, 7.59e35f);
#endif
}

TEST(CudaFp8Matmul, EveryCodeReadsAsTheHostDequantisesIt) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  // Weight row n holds code n mod 256 at one column and zero codes elsewhere, and every activation
  // is 1: each output is exactly the weight the kernel formed from that code (plus zeros), to be
  // the host's dequantisation bit for bit (a NaN as a NaN; -0 reads as +0 after the zeros). The
  // columns walk every byte of the 16-byte loads and both column blocks; the 16 blocks' scales
  // cycle through 1; 1 + 2^-8, whose products with codes of one or three mantissa bits are exact
  // ties between two bf16 values (to even); one that is not a power of two; a subnormal; 2^-10;
  // 3e5; and 7.59e35, which takes the largest codes past the largest bf16 to infinity. 1 and 3 rows round the weights
  // in pairs by conversion, 16 rows (two passes of 8) by integer adds: the same bits either way.
  const Case c{1024, 256, 128, 128, 0, 1024, 0, 256};
  Fp8Data d;
  d.q.assign(static_cast<size_t>(c.R * c.C), 0);
  std::vector<int64_t> col(static_cast<size_t>(c.R));
  for (int64_t n = 0; n < c.R; ++n) {
    col[n] = (n * 7 + (n / 256) * 64) % c.C;
    d.q[n * c.C + col[n]] = static_cast<uint8_t>(n % 256);
  }
  const float cycle[] = {1.0f, 1.00390625f, 0.7384f, 1e-39f, 0x1p-10f, 3.0e5f, 7.59e35f};
  d.scales.resize(16);
  for (size_t b = 0; b < d.scales.size(); ++b) d.scales[b] = cycle[b % 7];
  const TensorView tw = view("w", DType::F8_E4M3, {c.R, c.C}, d.q.data(), d.q.size());
  const TensorView ts = view("w_scale_inv", DType::F32, {8, 2}, d.scales.data(), d.scales.size() * 4);
  std::vector<uint16_t> w(static_cast<size_t>(c.R * c.C));
  dequant_fp8_block(tw, ts, c.br, c.bc, 0, c.R, 0, c.C, w.data());
  const DeviceWeight dw = upload(c, d);
  for (int64_t M : {1, 3, 16}) {
    const std::vector<float> y = run(dw, std::vector<uint16_t>(static_cast<size_t>(M * c.K), f32_to_bf16(1.0f)), M);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        const float want = bf16_to_f32(w[n * c.K + col[n]]), got = y[m * c.N + n];
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got)) << "M = " << M << " code " << n % 256 << " scale "
                                       << d.scales[(n / 128) * 2 + col[n] / 128];
        } else {
          ASSERT_EQ(got, want) << "M = " << M << " code " << n % 256 << " scale "
                               << d.scales[(n / 128) * 2 + col[n] / 128];
        }
      }
  }
#endif
}

TEST(CudaFp8GroupedGemm, TensorCoreTileFollowsTheFragmentLayout) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_mma_fp8_tile();
#endif
}

// On an H100 / H200 this checks the hardware's reading of the descriptors, the swizzle and the
// accumulators against the emulation's; the wgmma GEMM tests below then add the pipelines.
TEST(CudaFp8GroupedGemm, WgmmaTileFollowsTheSwizzleAndAccumulatorLayout) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  if (!test::gpu_is_hopper()) GTEST_SKIP() << "wgmma needs an sm_90 GPU";
  check_wgmma_tile();
#endif
}

TEST(CudaFp8GroupedGemm, GroupsMatchTheBlockScaledReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  // DeepSeek-V3's 128 x 128 blocks: an N and a K off the tile (200 outputs, the last of K's three
  // blocks 16 wide); groups of one row, of a tile and one more row, of three tiles, and empty.
  check_grouped_gemm({200, 272, 128, 128, 0, 200, 0, 272}, {1, 0, 64, 65, 130, 17, 3}, 0);
  // A tensor-parallel slice: rows from 8 (inside a scale row, so an output tile spans two), columns
  // from the second block; rows before the first group untouched.
  check_grouped_gemm({300, 512, 128, 128, 8, 264, 128, 384}, {33, 2, 70}, 5);
  // One output tile exactly, one group.
  check_grouped_gemm({128, 128, 128, 128, 0, 128, 0, 128}, {64}, 0);
#endif
}

// The same on Hopper's warpgroup fp8 products (fp8_grouped_gemm_wgmma.h): over the emulated runtime
// against its model of the descriptors and the 128-byte swizzle, on an H100 / H200 against the
// hardware's.
TEST(CudaFp8GroupedGemm, WgmmaGroupsMatchTheBlockScaledReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  if (!test::gpu_is_hopper()) GTEST_SKIP() << "wgmma needs an sm_90 GPU";
  check_grouped_gemm({200, 272, 128, 128, 0, 200, 0, 272}, {1, 0, 64, 65, 130, 17, 3}, 0, cuda::GemmCore::kWgmma);
  check_grouped_gemm({300, 512, 128, 128, 8, 264, 128, 384}, {33, 2, 70}, 5, cuda::GemmCore::kWgmma);
  check_grouped_gemm({128, 128, 128, 128, 0, 128, 0, 128}, {64}, 0, cuda::GemmCore::kWgmma);
#endif
}

TEST(CudaFp8GroupedGemm, TakesOnlyTheScaleGridItReads) {
#ifdef SHARDLM_HAVE_CUDA
  cuda::Fp8Weight w;
  w.N = 256;
  w.K = 512;
  w.scale_cols = 4;
  w.block_rows = w.block_cols = 128;
  EXPECT_TRUE(cuda::fp8_grouped_gemm_mma_fits(w));
  w.row_off = 4;  // an 8-output fragment would straddle two scale rows
  EXPECT_FALSE(cuda::fp8_grouped_gemm_mma_fits(w));
  w.row_off = 8;
  w.col_off = 64;  // a step's 128 features would straddle two scale columns
  EXPECT_FALSE(cuda::fp8_grouped_gemm_mma_fits(w));
  w.col_off = 0;
  w.K = 520;  // not whole 16-byte chunks
  EXPECT_FALSE(cuda::fp8_grouped_gemm_mma_fits(w));
  w.K = 512;
  w.block_cols = 64;
  EXPECT_FALSE(cuda::fp8_grouped_gemm_mma_fits(w));
#endif
}

}  // namespace
}  // namespace shardlm
