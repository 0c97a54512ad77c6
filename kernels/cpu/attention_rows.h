// Vector forms of the attention kernels' inner loops over cache rows (internal to the CPU kernels).
//
// Both compute exactly what their scalar definitions in reduce_util.h and the kernels compute, in
// the same order, element by element: only which rows share a register changes. So a kernel
// built on them gives the bits of the plain loops, and those bits do not depend on how rows,
// heads or tokens are grouped.
//  - dot16_x16_n: sixteen dot16 products of each of J queries with sixteen cache rows. dot16
//    keeps 16 lane partial sums and reduces them by a fixed tree; here each row's partials are one
//    vector, and the sixteen trees run together as a transpose whose every addition is one of the
//    tree's.
//  - accumulate_rows: out_r[d] += p_rj * v_j[d] over j in increasing order, the product rounded
//    then added (the kernels build with -ffp-contract=off), with up to kAccRows outputs held in
//    registers across the rows instead of being read and written per row.
// Cache rows are read through a row handle: const float*, const uint16_t* (a bf16 row, widened as
// it is loaded, exactly) or Fp8Row (an fp8 row and its scale, read back as it is loaded). Each
// gives the bits of the fp32 row holding the read-back values, so a kernel may also read a round
// of narrow rows back into fp32 rows first (widen_row) and reduce those: the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "bf16_bits.h"
#include "cpu/vec16.h"
#include "fp8_bits.h"

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace shardlm::cpu::detail {

// Sixteen bf16 values from p, widened: one zero extension and one shift.
inline v16f widen16(const uint16_t* p) {
  typedef uint16_t v16h __attribute__((vector_size(32)));
  typedef uint32_t v16u __attribute__((vector_size(64)));
  v16h h;
  std::memcpy(&h, p, sizeof h);
  const v16u w = __builtin_convertvector(h, v16u) << 16;
  v16f f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

// dst[i] = src[i] widened, i < n.
inline void widen_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16(dst + i, widen16(src + i));
  for (; i < n; ++i) dst[i] = bf16_bits::to_f32(src[i]);
}

namespace fp8_impl {
typedef uint8_t v16b __attribute__((vector_size(16)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));

inline v16h load_codes(const uint8_t* p) {
  v16b b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, v16h);
}

// The NaN codes S.1111.111 of c as NaN, the other lanes as f.
inline v16f nan_lanes(v16h c, v16f f) {
  return select16(__builtin_convertvector((c & 0x7f) == 0x7f, v16i), v16f{} + fp8_bits::to_f32(0x7f), f);
}

// Integer operations only: a normal code rebiased in place, a subnormal one (m * 2^-9, m < 8)
// converted from its integer m, then the sign. No subnormal fp32 operand (measured: placing every
// code's bits under the fp32 exponent field and scaling by 2^120, subnormal codes become subnormal
// operands, and decode attention ran 33% slower here).
inline v16f widen_portable(const uint8_t* p, float scale) {
  const v16h c = load_codes(p);
  const v16u u = __builtin_convertvector(c, v16u);  // via 16 bits: GCC 12 lowers 8 -> 32 bits to byte moves
  const v16u mag = u & 0x7fu;
  const v16u normal = (mag << 20) + (120u << 23);
  const v16f sub = __builtin_convertvector(reinterpret_cast<v16i>(mag), v16f) * 0x1p-9f;
  v16f f = select16(reinterpret_cast<v16i>(mag < 8u), sub, reinterpret_cast<v16f>(normal));
  f = reinterpret_cast<v16f>(reinterpret_cast<v16u>(f) | ((u & 0x80u) << 24));
  return nan_lanes(c, f * scale);
}

// A code's bits moved into a half float (sign to sign, exponent and mantissa under its exponent
// and mantissa) are the code's value times 2^-8 exactly, subnormal codes included (e4m3's bias is
// 7, half's 15); F16C widens halves exactly, and times scale * 2^8 (exact) that is one rounding of
// value * scale. Measured: 16% faster decode attention than widen_portable (EPYC, AVX-512).
#if defined(__F16C__)
inline v16f widen_f16c(const uint8_t* p, float scale) {
  const v16h c = load_codes(p);
  const v16h half = ((c & 0x80) << 8) | ((c & 0x7f) << 7);
  v16f f;
#if defined(__AVX512F__)
  // (maskz: the unmasked form starts from an undefined vector, which GCC 12 warns about)
  f = reinterpret_cast<v16f>(_mm512_maskz_cvtph_ps(0xffff, reinterpret_cast<__m256i>(half)));
#else
  const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(reinterpret_cast<__m256i>(half)));
  const __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(reinterpret_cast<__m256i>(half), 1));
  std::memcpy(&f, &lo, sizeof lo);
  std::memcpy(reinterpret_cast<char*>(&f) + sizeof lo, &hi, sizeof hi);
#endif
  return nan_lanes(c, f * (scale * 256.0f));
}
#endif

// widen_f16c's halves in fewer operations, with AVX-512BW: a sign-extended code shifted left by 7
// holds the code's sign at bit 15 and its exponent and mantissa at bits 7..14, so one AND clearing
// bit 14 (a copy of the sign) makes the half; the NaN codes are found on the bytes, as a mask.
// Measured, one decode token over 4096 positions (16 / 8 heads x 64, 2 threads, Xeon): 741-803 us
// through widen_f16c, whose NaN lanes go through 16- then 32-bit compares and a blend, 565-575 here.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
inline v16f widen_avx512(const uint8_t* p, float scale) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i half = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16(-16512));
  // (maskz: the unmasked form starts from an undefined vector, which GCC 12 warns about)
  const __m512 f = _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xffff, half), _mm512_set1_ps(scale * 256.0f));
  const __mmask16 nan = _mm_testn_epi8_mask(_mm_andnot_si128(b, _mm_set1_epi8(0x7f)), _mm_set1_epi8(0x7f));
  return reinterpret_cast<v16f>(_mm512_mask_mov_ps(f, nan, _mm512_set1_ps(fp8_bits::to_f32(0x7f))));
}
#endif
}  // namespace fp8_impl

// Sixteen fp8 e4m3fn codes from p read back, as fp8_bits::to_f32(c) * scale, bit for bit (both
// forms are one rounding of the code's exact value times scale).
inline v16f widen16(const uint8_t* p, float scale) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  return fp8_impl::widen_avx512(p, scale);
#elif defined(__F16C__)
  return fp8_impl::widen_f16c(p, scale);
#else
  return fp8_impl::widen_portable(p, scale);
#endif
}

// dst[i] = src[i] read back, i < n.
inline void widen_row(const uint8_t* src, int64_t n, float scale, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16(dst + i, widen16(src + i, scale));
  for (; i < n; ++i) dst[i] = fp8_bits::to_f32(src[i]) * scale;
}

// An fp8 cache row as the reducing loops read it: codes read back times the side's scale at each
// load. Pointer arithmetic and indexing as on a row pointer.
struct Fp8Row {
  const uint8_t* p;
  float scale;
  Fp8Row operator+(int64_t k) const { return {p + k, scale}; }
  float operator[](int64_t k) const { return fp8_bits::to_f32(p[k]) * scale; }
};

// Sixteen cache values from a row handle as fp32.
inline v16f load_row16(const float* p) { return load16(p); }
inline v16f load_row16(const uint16_t* p) { return widen16(p); }
inline v16f load_row16(Fp8Row r) { return widen16(r.p, r.scale); }
// One value of a row handle (r[k]) as fp32.
inline float row_value(float x) { return x; }
inline float row_value(uint16_t x) { return bf16_bits::to_f32(x); }

namespace dot_impl {
// dot16's tree stages (l, l+8), (l, l+4), (l, l+2) for 8 rows' lane partials a[0..8), each
// stage packing two vectors' surviving lanes side by side and adding the pairs the tree adds.
// The result holds, for each of the 8 rows, the two sums the last stage (0, 1) adds.
inline v16f tree8(const v16f* a) {
  v16f b[4], c[2];
  for (int m = 0; m < 4; ++m)
    b[m] =
        __builtin_shufflevector(a[2 * m], a[2 * m + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
        __builtin_shufflevector(a[2 * m], a[2 * m + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int m = 0; m < 2; ++m)
    c[m] = __builtin_shufflevector(b[2 * m], b[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * m], b[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  return __builtin_shufflevector(c[0], c[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
         __builtin_shufflevector(c[0], c[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}

// The last stage, (0, 1), for rows 0..7 (d0) and 8..15 (d1): lane i is row i's dot16.
inline v16f tree_last(v16f d0, v16f d1) {
  return __builtin_shufflevector(d0, d1, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(d0, d1, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// AVX2 (16 registers of 8 floats): GCC 12 moves the 64-byte vectors of the form below through the
// stack and general registers in 128-bit pieces there, so rows8 is written on 8-float vectors: a
// row's 16 lane partials as two halves (lanes 0..7 and 8..15), two rows per pass. The halves' sum
// is the tree's first stage (l, l + 8); the next two stages run on the eight rows' sums as tree8's
// do, and the result has tree8's layout: the same additions of the same operands, the same bits.
// Measured with -mavx2 on EPYC, with chunk16_avx2 below: one thread's decode attention over 2048
// positions 1823 -> 614 us; a 512-token prefill chunk at 1024 positions on 2 threads 114.6 -> 37.1
// ms (native AVX-512: 335 us for that decode).
namespace avx2 {
typedef float v8f __attribute__((vector_size(32)));
inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline v8f load_row8(const float* p) { return load8(p); }
inline v8f load_row8(const uint16_t* p) {
  typedef uint16_t v8h __attribute__((vector_size(16)));
  typedef uint32_t v8u __attribute__((vector_size(32)));
  v8h h;
  std::memcpy(&h, p, sizeof h);
  const v8u w = __builtin_convertvector(h, v8u) << 16;
  v8f f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
// Sixteen values of row r as two halves (lanes 0..7, 8..15). An fp8 row reads its sixteen codes
// in one load and widens them together.
template <class Row>
inline void load_row16_halves(Row r, v8f& lo, v8f& hi) {
  lo = load_row8(r);
  hi = load_row8(r + 8);
}
inline void load_row16_halves(Fp8Row r, v8f& lo, v8f& hi) {
  const v16f f = widen16(r.p, r.scale);
  std::memcpy(&lo, &f, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&f) + sizeof lo, sizeof hi);
}

// Stages (l, l + 4) and (l, l + 2) of eight rows whose stage-(l, l + 8) sums are x[0..8): for each
// row, the two sums the last stage (0, 1) adds, rows in order (tree8's layout).
inline v16f tree8_from_halves(const v8f* x) {
  v8f c[4], e[2];
  for (int m = 0; m < 4; ++m)
    c[m] = __builtin_shufflevector(x[2 * m], x[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(x[2 * m], x[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int m = 0; m < 2; ++m)
    e[m] = __builtin_shufflevector(c[2 * m], c[2 * m + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(c[2 * m], c[2 * m + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  v16f d;
  std::memcpy(&d, &e[0], sizeof e[0]);
  std::memcpy(reinterpret_cast<char*>(&d) + sizeof e[0], &e[1], sizeof e[1]);
  return d;
}
}  // namespace avx2

template <int J, class Row>
inline void rows8(const float* const* q, const Row* rows, int64_t n, v16f* d) {
  using avx2::v8f;
  v8f x[J][8];
  for (int i0 = 0; i0 < 8; i0 += 2) {
    v8f lo[J][2], hi[J][2];
    for (int j = 0; j < J; ++j)
      for (int i = 0; i < 2; ++i) lo[j][i] = hi[j][i] = v8f{};
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
      v8f ql[J], qh[J];
      for (int j = 0; j < J; ++j) ql[j] = avx2::load8(q[j] + k), qh[j] = avx2::load8(q[j] + k + 8);
      for (int i = 0; i < 2; ++i) {
        v8f rl, rh;
        avx2::load_row16_halves(rows[i0 + i] + k, rl, rh);
        for (int j = 0; j < J; ++j) lo[j][i] += ql[j] * rl, hi[j][i] += qh[j] * rh;
      }
    }
    if (k < n) {  // the tail: lane l < n - k only, as dot16 (the other lanes stay untouched)
      for (int j = 0; j < J; ++j)
        for (int i = 0; i < 2; ++i)
          for (int l = 0; k + l < n; ++l) {
            const float p = q[j][k + l] * row_value(rows[i0 + i][k + l]);
            if (l < 8) {
              lo[j][i][l] += p;
            } else {
              hi[j][i][l - 8] += p;
            }
          }
    }
    for (int j = 0; j < J; ++j)
      for (int i = 0; i < 2; ++i) x[j][i0 + i] = lo[j][i] + hi[j][i];
  }
  for (int j = 0; j < J; ++j) d[j] = avx2::tree8_from_halves(x[j]);
}
#else
// Lane partials of J queries against 8 rows, each row chunk loaded once for all J, then tree8.
template <int J, class Row>
inline void rows8(const float* const* q, const Row* rows, int64_t n, v16f* d) {
  v16f a[J][8];
  for (int j = 0; j < J; ++j)
    for (int i = 0; i < 8; ++i) a[j][i] = v16f{};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    v16f qk[J];
    for (int j = 0; j < J; ++j) qk[j] = load16(q[j] + k);
    for (int i = 0; i < 8; ++i) {
      const v16f r = load_row16(rows[i] + k);
      for (int j = 0; j < J; ++j) a[j][i] += qk[j] * r;
    }
  }
  if (k < n) {  // the tail: lane l < n - k only, as dot16 (the other lanes stay untouched)
    for (int j = 0; j < J; ++j)
      for (int i = 0; i < 8; ++i)
        for (int l = 0; k + l < n; ++l) a[j][i][l] += q[j][k + l] * row_value(rows[i][k + l]);
  }
  for (int j = 0; j < J; ++j) d[j] = tree8(a[j]);
}
#endif
}  // namespace dot_impl

// out[j][i] = dot16(q[j], rows[i], n) for i < 16, j < J. dot16 keeps 16 lane partial sums and
// reduces them by a fixed tree; here each row's partials are one vector and the sixteen trees run
// together as a transpose whose every addition is one of the tree's. With J = 2 each chunk of a
// row is loaded once for two queries (two heads of a KV head, or two tokens).
template <int J, class Row>
inline void dot16_x16_n(const float* const* q, const Row* rows, int64_t n, v16f* out) {
  v16f d0[J], d1[J];
  dot_impl::rows8<J, Row>(q, rows, n, d0);
  dot_impl::rows8<J, Row>(q, rows + 8, n, d1);
  for (int j = 0; j < J; ++j) out[j] = dot_impl::tree_last(d0[j], d1[j]);
}

// One output row of accumulate_rows: it takes value rows j in [jb, je), row j with weight
// p[j - jb]; out holds the running sums.
struct AccRow {
  float* out;
  const float* p;
  int64_t jb, je;
};
constexpr int kAccRows = 4;

namespace acc_impl {
// Dims [c0, c0 + 16 V) of up to kAccRows outputs, in registers over the nj value rows.
template <int V, class Row>
inline void chunk(const AccRow* r, int nr, const Row* vals, int64_t nj, int64_t c0) {
  v16f acc[kAccRows][V];
  for (int i = 0; i < nr; ++i)
    for (int u = 0; u < V; ++u) acc[i][u] = load16(r[i].out + c0 + 16 * u);
  for (int64_t j = 0; j < nj; ++j) {
    v16f v[V];
    for (int u = 0; u < V; ++u) v[u] = load_row16(vals[j] + c0 + 16 * u);
    for (int i = 0; i < nr; ++i) {
      if (j < r[i].jb || j >= r[i].je) continue;
      const float p = r[i].p[j - r[i].jb];
      for (int u = 0; u < V; ++u) acc[i][u] += p * v[u];
    }
  }
  for (int i = 0; i < nr; ++i)
    for (int u = 0; u < V; ++u) store16(r[i].out + c0 + 16 * u, acc[i][u]);
}
#if defined(__AVX2__) && !defined(__AVX512F__)
// chunk<1> on 8-float vectors: dims [c0, c0 + 16) as two halves.
template <class Row>
inline void chunk16_avx2(const AccRow* r, int nr, const Row* vals, int64_t nj, int64_t c0) {
  using dot_impl::avx2::v8f;
  v8f acc[kAccRows][2];
  for (int i = 0; i < nr; ++i)
    for (int h = 0; h < 2; ++h) acc[i][h] = dot_impl::avx2::load8(r[i].out + c0 + 8 * h);
  for (int64_t j = 0; j < nj; ++j) {
    v8f v0, v1;
    dot_impl::avx2::load_row16_halves(vals[j] + c0, v0, v1);
    for (int i = 0; i < nr; ++i) {
      if (j < r[i].jb || j >= r[i].je) continue;
      const float p = r[i].p[j - r[i].jb];
      acc[i][0] += p * v0;
      acc[i][1] += p * v1;
    }
  }
  for (int i = 0; i < nr; ++i)
    for (int h = 0; h < 2; ++h) std::memcpy(r[i].out + c0 + 8 * h, &acc[i][h], sizeof(v8f));
}
#endif
}  // namespace acc_impl

// r[i].out[d] += r[i].p[j - jb] * vals[j][d] for d < width, j in [r[i].jb, r[i].je) increasing;
// nr <= kAccRows.
template <class Row>
inline void accumulate_rows(const AccRow* r, int nr, const Row* vals, int64_t nj, int64_t width) {
  int64_t c0 = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
  // 16 registers of 8 floats: kAccRows x 4 accumulators went to the stack at every row (perf: 56%
  // of decode attention), so 16 dims at a time, on 8-float vectors (GCC 12's 64-byte vectors go
  // through the stack there too). The same operations per output, so the same bits.
  for (; c0 + 16 <= width; c0 += 16) acc_impl::chunk16_avx2(r, nr, vals, nj, c0);
#elif !defined(__AVX512F__)
  for (; c0 + 16 <= width; c0 += 16) acc_impl::chunk<1, Row>(r, nr, vals, nj, c0);
#endif
  for (; c0 + 64 <= width; c0 += 64) acc_impl::chunk<4, Row>(r, nr, vals, nj, c0);
  switch ((width - c0) / 16) {
    case 3:
      acc_impl::chunk<3, Row>(r, nr, vals, nj, c0);
      break;
    case 2:
      acc_impl::chunk<2, Row>(r, nr, vals, nj, c0);
      break;
    case 1:
      acc_impl::chunk<1, Row>(r, nr, vals, nj, c0);
      break;
    default:
      break;
  }
  c0 += (width - c0) / 16 * 16;
  for (int i = 0; i < nr; ++i)  // the last width % 16 dims
    for (int64_t j = r[i].jb; j < r[i].je; ++j)
      for (int64_t d = c0; d < width; ++d) r[i].out[d] += r[i].p[j - r[i].jb] * row_value(vals[j][d]);
}

}  // namespace shardlm::cpu::detail
