// FP8 e4m3fn conversions and 128x128 block-scaled (de)quantisation (model/fp8_block.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/backend_data.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/fp8_block.h"
#include "test_util.h"

namespace shardlm {
namespace {

using test::expect_error;

// The e4m3fn value of code c, computed independently of the library: (-1)^s * 2^(e-7) * (1 + m/8)
// for e > 0, (-1)^s * 2^-6 * m/8 for e == 0, NaN for S.1111.111.
double e4m3fn_reference(int c) {
  const int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

bool is_nan_code(int c) { return (c & 0x7f) == 0x7f; }

TEST(Fp8Block, DecodesAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const float got = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    const double want = e4m3fn_reference(c);
    if (is_nan_code(c)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // 0x80 is -0
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
}

TEST(Fp8Block, EncodeDecodeRoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if (is_nan_code(c)) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(0.0f), 0x00);
}

TEST(Fp8Block, EncodeNaN) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f32_to_fp8_e4m3(qnan) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(-qnan), 0xff);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(f32_to_fp8_e4m3(std::numeric_limits<float>::signaling_NaN()))));
}

// Between every pair of neighbouring non-negative codes: the midpoint goes to the even code, a
// value just below/above it to the nearer one.
TEST(Fp8Block, RoundsToNearestEvenBetweenNeighbours) {
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3fn_reference(c), hi = e4m3fn_reference(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in f32
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(mid), even) << "midpoint of codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), even | 0x80) << "negative midpoint of codes " << c << ", " << c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 0.0f)), c) << "below midpoint " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 1e9f)), c + 1) << "above midpoint " << c;
  }
}

TEST(Fp8Block, Saturates) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1000.0f, 1e30f, std::numeric_limits<float>::max(), inf}) {
    EXPECT_EQ(f32_to_fp8_e4m3(v), 0x7e) << v;
    EXPECT_EQ(f32_to_fp8_e4m3(-v), 0xfe) << -v;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(416.0f), 0x7d);    // largest code below 448
  EXPECT_EQ(f32_to_fp8_e4m3(431.99f), 0x7d);
  EXPECT_EQ(f32_to_fp8_e4m3(432.0f), 0x7e);    // tie 416 | 448 -> 448 (even mantissa 6)
  EXPECT_EQ(f32_to_fp8_e4m3(447.99f), 0x7e);
}

TEST(Fp8Block, SubnormalBoundary) {
  const float tiny = std::ldexp(1.0f, -9);   // smallest subnormal e4m3
  const float normal = std::ldexp(1.0f, -6);  // smallest normal e4m3
  EXPECT_EQ(f32_to_fp8_e4m3(tiny), 0x01);
  EXPECT_EQ(f32_to_fp8_e4m3(tiny / 2), 0x00);                           // tie -> even (0)
  EXPECT_EQ(f32_to_fp8_e4m3(-tiny / 2), 0x80);                          // -0 kept
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(tiny / 2, 1.0f)), 0x01);
  EXPECT_EQ(f32_to_fp8_e4m3(tiny * 1.5f), 0x02);                        // tie 1|2 -> 2
  EXPECT_EQ(f32_to_fp8_e4m3(tiny * 2.5f), 0x02);                        // tie 2|3 -> 2
  EXPECT_EQ(f32_to_fp8_e4m3(tiny * 7.0f), 0x07);                        // largest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(tiny * 7.5f), 0x08);                        // tie 7|8 -> 8 = 2^-6
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(tiny * 7.5f, 0.0f)), 0x07);
  EXPECT_EQ(f32_to_fp8_e4m3(normal), 0x08);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(normal, 0.0f)), 0x08);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);  // f32 subnormals
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::min()), 0x80);
}

// Exhaustive check of the encoder against a brute-force nearest-code search on a dense sample of
// f32 values (every 2^12-th bit pattern below the saturation point, both signs).
TEST(Fp8Block, EncodeMatchesNearestCodeSearch) {
  std::vector<double> vals;
  for (int c = 0; c <= 0x7e; ++c) vals.push_back(e4m3fn_reference(c));
  for (uint32_t u = 0; u < 0x43e00000u; u += 4096 + 7) {
    float f;
    std::memcpy(&f, &u, 4);
    // Nearest code; ties to the even code.
    int best = 0;
    for (int c = 1; c <= 0x7e; ++c) {
      const double dc = std::fabs(vals[c] - f), db = std::fabs(vals[best] - f);
      if (dc < db || (dc == db && c % 2 == 0)) best = c;
    }
    ASSERT_EQ(f32_to_fp8_e4m3(f), best) << "f=" << f << " bits=" << u;
    ASSERT_EQ(f32_to_fp8_e4m3(-f), best | 0x80) << "f=" << -f;
  }
}

// A TensorView over caller-owned bytes.
TensorView view(const std::string& name, DType dt, std::vector<int64_t> shape, const void* data) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  TensorView t = test::tensor_view(name, dt, std::move(shape), data, static_cast<size_t>(numel) * dtype_size(dt));
  t.file = "/ckpt/model-00001.safetensors";
  return t;
}

struct Quantised {
  int64_t R, C, br, bc;
  std::vector<float> w;
  std::vector<uint8_t> q;
  std::vector<float> scale;
};

Quantised make_quantised(int64_t R, int64_t C, int64_t br, int64_t bc, uint32_t seed) {
  Quantised m{R, C, br, bc, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  m.w.resize(static_cast<size_t>(R * C));
  // Blocks with very different magnitudes, so that per-block scales matter.
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float mag = std::ldexp(1.0f, static_cast<int>(((r / br) * 7 + (c / bc) * 3) % 13) - 8);
      m.w[r * C + c] = nd(rng) * mag;
    }
  const int64_t nrb = (R + br - 1) / br, ncb = (C + bc - 1) / bc;
  m.q.resize(m.w.size());
  m.scale.resize(static_cast<size_t>(nrb * ncb));
  quantize_fp8_block(m.w.data(), R, C, br, bc, m.q.data(), m.scale.data());
  return m;
}

TEST(Fp8Block, QuantizeDequantizeErrorBoundPerBlock) {
  const Quantised m = make_quantised(300, 200, 128, 128, 1234);
  const int64_t R = m.R, C = m.C;
  ASSERT_EQ(m.scale.size(), 3u * 2u);
  const TensorView w = view("layers.0.mlp.down_proj.weight", DType::F8_E4M3, {R, C}, m.q.data());
  const TensorView s = view("layers.0.mlp.down_proj.weight_scale_inv", DType::F32, {3, 2}, m.scale.data());
  std::vector<uint16_t> out(static_cast<size_t>(R * C));
  dequant_fp8_block(w, s, 128, 128, 0, R, 0, C, out.data());

  for (int64_t rb = 0; rb < 3; ++rb)
    for (int64_t cb = 0; cb < 2; ++cb) {
      float amax = 0.0f;
      for (int64_t r = rb * 128; r < std::min<int64_t>(R, rb * 128 + 128); ++r)
        for (int64_t c = cb * 128; c < std::min<int64_t>(C, cb * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(m.w[r * C + c]));
      const float scale = m.scale[rb * 2 + cb];
      EXPECT_EQ(scale, amax / 448.0f);
      for (int64_t r = rb * 128; r < std::min<int64_t>(R, rb * 128 + 128); ++r)
        for (int64_t c = cb * 128; c < std::min<int64_t>(C, cb * 128 + 128); ++c) {
          const size_t i = static_cast<size_t>(r * C + c);
          const float deq = bf16_to_f32(out[i]);
          const uint8_t code = m.q[i];
          // Exactly bf16(fp32(fp8) * fp32(scale)).
          ASSERT_EQ(out[i], f32_to_bf16(static_cast<float>(e4m3fn_reference(code)) * scale)) << r << "," << c;
          const double err = std::fabs(static_cast<double>(deq) - m.w[i]);
          // fp8: 2^-4 relative for normals (<= 2^-4 amax), 2^-10 * scale absolute for subnormals;
          // bf16: 2^-9 relative.
          const double bound_elem = std::ldexp(std::fabs(m.w[i]), -4) + std::ldexp(scale, -10) +
                                    std::ldexp(std::fabs(static_cast<double>(deq)), -8);
          ASSERT_LE(err, bound_elem) << r << "," << c << " w=" << m.w[i] << " deq=" << deq;
          ASSERT_LE(err, std::ldexp(amax, -4) * (1 + 1.0 / 128)) << r << "," << c;
        }
    }
}

TEST(Fp8Block, SliceEqualsPartOfWhole) {
  const Quantised m = make_quantised(300, 200, 128, 128, 99);
  const int64_t R = m.R, C = m.C;
  const TensorView w = view("w", DType::F8_E4M3, {R, C}, m.q.data());
  // BF16 scales as well as F32.
  std::vector<uint16_t> scale_bf16;
  for (float f : m.scale) scale_bf16.push_back(f32_to_bf16(f));
  for (DType sdt : {DType::F32, DType::BF16}) {
    const void* sdata = sdt == DType::F32 ? static_cast<const void*>(m.scale.data()) : scale_bf16.data();
    const TensorView s = view("w_scale_inv", sdt, {3, 2}, sdata);
    std::vector<uint16_t> whole(static_cast<size_t>(R * C));
    dequant_fp8_block(w, s, 128, 128, 0, R, 0, C, whole.data());
    struct Sl {
      int64_t r0, nr, c0, nc;
    };
    for (const Sl sl : {Sl{37, 200, 51, 120}, Sl{127, 2, 127, 2}, Sl{129, 171, 0, 200}, Sl{0, 1, 0, 1},
                        Sl{299, 1, 199, 1}, Sl{5, 295, 130, 70}, Sl{100, 0, 3, 7}}) {
      std::vector<uint16_t> part(static_cast<size_t>(sl.nr * sl.nc) + 1, 0xdead);
      dequant_fp8_block(w, s, 128, 128, sl.r0, sl.nr, sl.c0, sl.nc, part.data());
      for (int64_t r = 0; r < sl.nr; ++r)
        for (int64_t c = 0; c < sl.nc; ++c)
          ASSERT_EQ(part[r * sl.nc + c], whole[(sl.r0 + r) * C + sl.c0 + c])
              << "slice r0=" << sl.r0 << " c0=" << sl.c0 << " at " << r << "," << c;
      EXPECT_EQ(part.back(), 0xdead) << "wrote past the slice";
    }
    // Each element against the formula, with the scale of its block in the scale's dtype.
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t b = (r / 128) * 2 + c / 128;
        const float sc = sdt == DType::F32 ? m.scale[b] : bf16_to_f32(scale_bf16[b]);
        ASSERT_EQ(whole[r * C + c], f32_to_bf16(static_cast<float>(e4m3fn_reference(m.q[r * C + c])) * sc));
      }
  }
}

// Every code (NaN included) times a spread of scales; both the table path (large blocks) and the
// direct path (thin slices) must give bf16(fp32(code) * scale) bit for bit.
TEST(Fp8Block, AllCodesAllPathsMatchFormula) {
  const int64_t R = 512, C = 256;  // row r, column c holds code (r + c) % 256
  std::vector<uint8_t> q(static_cast<size_t>(R * C));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) q[r * C + c] = static_cast<uint8_t>((r + c) % 256);
  std::vector<float> sc = {1.0f, 3.1e-5f, -0.7f, 1.7e4f, 0.0f, 2.5e-40f, 1.1e37f, 0.123456f};  // 4 x 2
  const TensorView w = view("w", DType::F8_E4M3, {R, C}, q.data());
  const TensorView s = view("s", DType::F32, {4, 2}, sc.data());
  std::vector<uint16_t> out(static_cast<size_t>(R * C));
  dequant_fp8_block(w, s, 128, 128, 0, R, 0, C, out.data());
  auto check = [&](int64_t r, int64_t c, uint16_t got) {
    const float v = static_cast<float>(e4m3fn_reference(q[r * C + c])) * sc[(r / 128) * 2 + c / 128];
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(got))) << r << "," << c;
    } else {
      ASSERT_EQ(got, f32_to_bf16(v)) << r << "," << c << " v=" << v;
    }
  };
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) check(r, c, out[r * C + c]);
  // Single-row slices (direct path).
  std::vector<uint16_t> row(static_cast<size_t>(C));
  for (int64_t r : {0, 127, 128, 300, 511}) {
    dequant_fp8_block(w, s, 128, 128, r, 1, 0, C, row.data());
    for (int64_t c = 0; c < C; ++c) {
      check(r, c, row[c]);
      EXPECT_EQ(row[c], out[r * C + c]);
    }
  }
}

TEST(Fp8Block, QuantizeEdgeCases) {
  // All-zero block -> scale 1, codes 0; -0 kept.
  std::vector<float> w(4 * 6, 0.0f);
  w[1] = -0.0f;
  std::vector<uint8_t> q(w.size(), 0xaa);
  std::vector<float> s(2 * 2, -1.0f);
  // 4 x 6 with 2 x 4 blocks: scales [2, 2]; block (1, 1) gets a value.
  w[3 * 6 + 5] = -10.0f;
  w[2 * 6 + 4] = 5.0f;
  quantize_fp8_block(w.data(), 4, 6, 2, 4, q.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_EQ(s[3], 10.0f / 448.0f);
  EXPECT_EQ(q[0], 0x00);
  EXPECT_EQ(q[1], 0x80);
  EXPECT_EQ(q[3 * 6 + 5], 0xfe);  // -amax -> -448
  EXPECT_EQ(q[2 * 6 + 4], f32_to_fp8_e4m3(5.0f / (10.0f / 448.0f)));
  EXPECT_EQ(fp8_e4m3_to_f32(q[2 * 6 + 4]), 224.0f);
  // A block whose amax / 448 underflows to 0 still quantises to finite codes.
  std::vector<float> tiny = {std::numeric_limits<float>::denorm_min() * 3, 0.0f};
  std::vector<uint8_t> qt(2);
  float st = 0;
  quantize_fp8_block(tiny.data(), 1, 2, 128, 128, qt.data(), &st);
  EXPECT_GT(st, 0.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(qt[0]) * st, tiny[0]);
}

TEST(Fp8Block, ErrorsNameBothTensorsAndFile) {
  std::vector<uint8_t> q(300 * 200, 0x38);
  std::vector<float> sc(6, 1.0f);
  const TensorView w = view("model.layers.3.mlp.gate_proj.weight", DType::F8_E4M3, {300, 200}, q.data());
  std::vector<uint16_t> out(300 * 200);
  const std::string wn = "model.layers.3.mlp.gate_proj.weight", sn = "model.layers.3.mlp.gate_proj.weight_scale_inv";
  const std::string file = "/ckpt/model-00001.safetensors";

  // Wrong scale shape (transposed, and one block short).
  for (std::vector<int64_t> bad : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{2, 2}, std::vector<int64_t>{6}}) {
    TensorView s = view(sn, DType::F32, bad, sc.data());
    expect_error([&] { dequant_fp8_block(w, s, 128, 128, 0, 300, 0, 200, out.data()); },
                 {wn, sn, file, "[3, 2]", "[300, 200]"});
  }
  const TensorView s = view(sn, DType::F32, {3, 2}, sc.data());
  // Wrong scale dtype.
  TensorView s16 = view(sn, DType::F16, {3, 2}, sc.data());
  expect_error([&] { dequant_fp8_block(w, s16, 128, 128, 0, 300, 0, 200, out.data()); }, {wn, sn, "F16"});
  // Weight not fp8 / not 2-D.
  TensorView wbf = view(wn, DType::BF16, {150, 200}, q.data());
  expect_error([&] { dequant_fp8_block(wbf, s, 128, 128, 0, 150, 0, 200, out.data()); }, {wn, sn, "BF16"});
  TensorView w1 = view(wn, DType::F8_E4M3, {60000}, q.data());
  expect_error([&] { dequant_fp8_block(w1, s, 128, 128, 0, 1, 0, 1, out.data()); }, {wn, sn, "[60000]"});
  // Slice out of range.
  expect_error([&] { dequant_fp8_block(w, s, 128, 128, 250, 51, 0, 200, out.data()); }, {wn, sn, "[250, 301)"});
  expect_error([&] { dequant_fp8_block(w, s, 128, 128, 0, 10, -1, 5, out.data()); }, {wn, sn});
  expect_error([&] { dequant_fp8_block(w, s, 128, 128, 0, 10, 150, 51, out.data()); }, {wn, sn, "[150, 201)"});
  // Bad block size.
  expect_error([&] { dequant_fp8_block(w, s, 0, 128, 0, 10, 0, 10, out.data()); }, {wn, sn, "block size"});
  // Scale file differs from the weight's: both files are named.
  TensorView s2 = view(sn, DType::F32, {3, 3}, sc.data());
  s2.file = "/ckpt/model-00002.safetensors";
  expect_error([&] { dequant_fp8_block(w, s2, 128, 128, 0, 300, 0, 200, out.data()); },
               {wn, sn, file, "/ckpt/model-00002.safetensors"});
}

}  // namespace
}  // namespace shardlm
