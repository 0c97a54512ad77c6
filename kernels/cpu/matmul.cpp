// y[M,N] = x[M,K] · W[N,K]^T (+ bias), fp32 or bf16 weights.
//
// Design (see matmul.h for the batch-invariance contract):
//  * Dot-product form vectorised along K. Every output element owns one vector accumulator of
//    L lanes (L = 16 with AVX-512, 8 with AVX2, 8 in the scalar fallback); lane l sums
//    x[k]*w[k] for k = l, l+L, l+2L, ... in increasing k with one FMA per step. A K tail is
//    loaded with zeros in the unused lanes (exact: fma(0, 0, a) == a). The lanes are then reduced
//    with one fixed tree (l, l+L/2), (l, l+L/4), ... and the bias is added last.
//  * That per-element arithmetic is the same in every micro-kernel instantiation (MR x NR tile,
//    tails in M and N included), in every thread and for every M, so a row's result is
//    bit-identical whether M = 1 or M = 512. K is never split across threads.
//  * Register tile MR rows of x × NR rows of W; threads split N; M is blocked so the x block stays
//    in L2. With several row tiles per block, the bf16 weight tile is converted once to a packed
//    fp32 panel (exact conversion, so results are unchanged) and reused from L1; the next tile
//    is prefetched into L2 meanwhile.
//  * Decode (M = 1, and M <= MR) streams the weights once with bf16 -> fp32 conversion in
//    registers and a software prefetch of the next tile (the tile's short interleaved row
//    streams defeat the hardware prefetcher: ~1.7x single-thread bandwidth with it).
//  * Tunables (compile-time): SHARDLM_MM_MR / SHARDLM_MM_NR (AVX-512 tile, default 4 x 6),
//    SHARDLM_MM_PFLOC (prefetch locality hint, default 2 = prefetcht1).
#include "cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/threads.h"

#if defined(__AVX512F__) || defined(__AVX2__)
// GCC 12 warns falsely about _mm256_undefined_*() inside the AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace shardlm::cpu {
namespace {

inline float bf16f(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__AVX512F__)
// ---------------------------------------------------------------- AVX-512 (16 lanes)
constexpr int kLanes = 16;
#ifndef SHARDLM_MM_MR
#define SHARDLM_MM_MR 4
#define SHARDLM_MM_NR 6
#endif
constexpr int kMR = SHARDLM_MM_MR;  // x rows per register tile
constexpr int kNR = SHARDLM_MM_NR;  // W rows per register tile
using vec = __m512;

inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vload(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vec vload_tail(const float* p, int n) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p); }
inline vec vload_tail(const uint16_t* p, int n) {
  __m256i h = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
// Keeps a loaded vector in a register: without it GCC folds the load into every FMA that uses
// it, turning one load per weight vector into MR loads, and load ports become the bottleneck.
inline void vpin(vec& v) { __asm__("" : "+v"(v)); }
// Fixed tree: 16 -> 8 -> 4 -> 2 -> 1.
inline float vreduce(vec v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}
#elif defined(__AVX2__) && defined(__FMA__)
// ---------------------------------------------------------------- AVX2 (8 lanes)
constexpr int kLanes = 8;
constexpr int kMR = 3;
constexpr int kNR = 4;
using vec = __m256;

inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vload(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline vec vload_tail(const float* p, int n) {
  alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) t[i] = p[i];
  return _mm256_load_ps(t);
}
inline vec vload_tail(const uint16_t* p, int n) {
  alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) t[i] = bf16f(p[i]);
  return _mm256_load_ps(t);
}
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vpin(vec& v) { __asm__("" : "+x"(v)); }
inline float vreduce(vec v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}
#else
// ---------------------------------------------------------------- scalar (8 lanes emulated)
constexpr int kLanes = 8;
constexpr int kMR = 2;
constexpr int kNR = 4;
struct vec {
  float v[8];
};
inline float wf(float f) { return f; }
inline float wf(uint16_t h) { return bf16f(h); }
template <typename T>
inline vec vload(const T* p) {
  vec r;
  for (int i = 0; i < 8; ++i) r.v[i] = wf(p[i]);
  return r;
}
template <typename T>
inline vec vload_tail(const T* p, int n) {
  vec r;
  for (int i = 0; i < 8; ++i) r.v[i] = i < n ? wf(p[i]) : 0.0f;
  return r;
}
inline vec vzero() { return vec{{0, 0, 0, 0, 0, 0, 0, 0}}; }
inline void vpin(vec&) {}
inline vec vfma(vec a, vec b, vec c) {
  for (int i = 0; i < 8; ++i) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline float vreduce(vec v) {
  float a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = v.v[i] + v.v[i + 4];
  for (int i = 0; i < 2; ++i) b[i] = a[i] + a[i + 2];
  return b[0] + b[1];
}
#endif

#ifndef SHARDLM_MM_PFT
#define SHARDLM_MM_PFT 1  // prefetch this many tiles ahead
#endif
#ifndef SHARDLM_MM_PFLOC
#define SHARDLM_MM_PFLOC 2
#endif

// One register tile: y[m, n] for m < MR, n < NR; x rows ldx apart, W rows ldw apart.
template <int MR, int NR, typename WT, bool PF>
inline void micro(const float* __restrict x, int64_t ldx, const WT* __restrict w, int64_t ldw, int64_t K,
                  const float* bias, float* __restrict y, int64_t ldy) {
  vec acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = vzero();
  const int64_t Kv = K - K % kLanes;
  for (int64_t k = 0; k < Kv; k += kLanes) {
    vec xv[MR];
    for (int m = 0; m < MR; ++m) {
      xv[m] = vload(x + m * ldx + k);
      vpin(xv[m]);
    }
    if constexpr (PF) {
      // Decode streams W once. The tile's NR rows are short interleaved streams that the hardware
      // prefetcher picks up late, so prefetch the next tile's rows (contiguous after this tile's
      // when ldw == K), spread evenly over this tile's K steps. Prefetching never faults.
      constexpr int kLines = (NR * static_cast<int>(sizeof(WT)) * kLanes) / 64;
      const char* next =
          reinterpret_cast<const char*>(w + SHARDLM_MM_PFT * NR * ldw) + k * NR * static_cast<int64_t>(sizeof(WT));
      for (int j = 0; j < kLines; ++j) __builtin_prefetch(next + 64 * j, 0, SHARDLM_MM_PFLOC);
    }
    for (int n = 0; n < NR; ++n) {
      vec wv = vload(w + n * ldw + k);
      vpin(wv);
      for (int m = 0; m < MR; ++m) acc[m][n] = vfma(xv[m], wv, acc[m][n]);
    }
  }
  if (Kv < K) {
    const int r = static_cast<int>(K - Kv);
    vec xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = vload_tail(x + m * ldx + Kv, r);
    for (int n = 0; n < NR; ++n) {
      vec wv = vload_tail(w + n * ldw + Kv, r);
      for (int m = 0; m < MR; ++m) acc[m][n] = vfma(xv[m], wv, acc[m][n]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) {
      float s = vreduce(acc[m][n]);
      if (bias) s += bias[n];
      y[m * ldy + n] = s;
    }
}

template <typename WT>
using MicroFn = void (*)(const float*, int64_t, const WT*, int64_t, int64_t, const float*, float*, int64_t);

template <typename WT, bool PF, int MR, std::size_t... N>
constexpr auto row_table(std::index_sequence<N...>) {
  return std::array<MicroFn<WT>, sizeof...(N)>{&micro<MR, static_cast<int>(N) + 1, WT, PF>...};
}
template <typename WT, bool PF, std::size_t... M>
constexpr auto full_table(std::index_sequence<M...>) {
  return std::array<std::array<MicroFn<WT>, kNR>, sizeof...(M)>{
      row_table<WT, PF, static_cast<int>(M) + 1>(std::make_index_sequence<kNR>{})...};
}
// table[mr-1][nr-1]; PF: prefetch the next weight tile (weights streamed once, small M).
template <typename WT, bool PF>
const auto kTable = full_table<WT, PF>(std::make_index_sequence<kMR>{});

// Decode (M = 1) tile: wider in N for more independent streams; per-element arithmetic unchanged.
constexpr int kNR1 = 8;

struct AlignedBuf {
  float* p = nullptr;
  size_t n = 0;
  ~AlignedBuf() { std::free(p); }
  float* get(size_t want) {
    if (want > n) {
      std::free(p);
      p = static_cast<float*>(std::aligned_alloc(64, ((want * 4 + 63) / 64) * 64));
      n = want;
    }
    return p;
  }
};

template <typename WT>
void pack_rows(const WT* w, int64_t ldw, int rows, int64_t K, float* out) {
  for (int r = 0; r < rows; ++r) {
    const WT* src = w + r * ldw;
    float* dst = out + r * K;
    if constexpr (std::is_same_v<WT, float>) {
      std::memcpy(dst, src, K * sizeof(float));
    } else {
      for (int64_t k = 0; k < K; ++k) dst[k] = bf16f(src[k]);
    }
  }
}

// Rows [n_begin, n_end) of y for all M, on the calling thread.
template <typename WT>
void matmul_range(const float* x, int64_t M, int64_t K, const WT* w, const float* bias, float* y, int64_t N,
                  int64_t n_begin, int64_t n_end) {
  if (n_begin >= n_end) return;
  if (M == 1) {
    int64_t n = n_begin;
    for (; n + kNR1 <= n_end; n += kNR1)
      micro<1, kNR1, WT, true>(x, K, w + n * K, K, K, bias ? bias + n : nullptr, y + n, N);
    if (n < n_end) {
      const int nr = static_cast<int>(n_end - n);
      if (nr > kNR) {
        kTable<WT, true>[0][kNR - 1](x, K, w + n * K, K, K, bias ? bias + n : nullptr, y + n, N);
        n += kNR;
      }
      if (n < n_end)
        kTable<WT, true>[0][n_end - n - 1](x, K, w + n * K, K, K, bias ? bias + n : nullptr, y + n, N);
    }
    return;
  }
  // x block of MB rows kept in L2 (~512 KiB).
  int64_t MB = std::max<int64_t>(kMR, (512 * 1024 / 4 / std::max<int64_t>(K, 1)) / kMR * kMR);
  // Pack the weight tile to fp32 when it is reused by more than one row tile (bf16) and the
  // panel is small enough for L1/L2; fp32 weights are used in place.
  const bool pack = !std::is_same_v<WT, float> && M > kMR;
  static thread_local AlignedBuf buf;
  float* panel = pack ? buf.get(static_cast<size_t>(kNR) * K) : nullptr;
  const auto& tf = kTable<float, false>;
  const auto& tw = M <= kMR ? kTable<WT, true> : kTable<WT, false>;
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t m1 = std::min(M, m0 + MB);
    for (int64_t n = n_begin; n < n_end; n += kNR) {
      const int nr = static_cast<int>(std::min<int64_t>(kNR, n_end - n));
      const float* b = bias ? bias + n : nullptr;
      if (pack) {
        pack_rows(w + n * K, K, nr, K, panel);
        // Fetch the next weight tile into L2 while this one is used by the whole M block.
        if (n + kNR < n_end) {
          const char* nx = reinterpret_cast<const char*>(w + (n + kNR) * K);
          const int64_t bytes = std::min<int64_t>(kNR, n_end - n - kNR) * K * static_cast<int64_t>(sizeof(WT));
          for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(nx + off, 0, 2);
        }
        for (int64_t m = m0; m < m1; m += kMR) {
          const int mr = static_cast<int>(std::min<int64_t>(kMR, m1 - m));
          tf[mr - 1][nr - 1](x + m * K, K, panel, K, K, b, y + m * N + n, N);
        }
      } else {
        for (int64_t m = m0; m < m1; m += kMR) {
          const int mr = static_cast<int>(std::min<int64_t>(kMR, m1 - m));
          tw[mr - 1][nr - 1](x + m * K, K, w + n * K, K, K, b, y + m * N + n, N);
        }
      }
    }
  }
}

template <typename WT>
void matmul_impl(const float* x, int64_t M, int64_t K, const WT* w, int64_t N, const float* bias, float* y) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = bias ? bias[n] + 0.0f : 0.0f;
    return;
  }
  // Split N into per-thread ranges aligned to the tile width; tiny problems run on one thread.
  const int64_t align = M == 1 ? kNR1 : kNR;
  const int64_t tiles = (N + align - 1) / align;
  int nt = num_threads();
  const double work = static_cast<double>(M) * N * K;
  if (work < 64.0 * 1024) nt = 1;
  nt = static_cast<int>(std::min<int64_t>(nt, tiles));
  if (nt <= 1) {
    matmul_range(x, M, K, w, bias, y, N, 0, N);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int T = omp_get_num_threads();
    const int64_t t0 = tiles * t / T, t1 = tiles * (t + 1) / T;
    matmul_range(x, M, K, w, bias, y, N, std::min(N, t0 * align), std::min(N, t1 * align));
  }
}

template <typename WT>
void matmul_parts_impl(const float* x, int64_t M, int64_t K, const MatmulPart<WT>* parts, int64_t n_parts) {
  if (M <= 0 || n_parts <= 0) return;
  if (K <= 0) {
    for (int64_t p = 0; p < n_parts; ++p) matmul_impl<WT>(x, M, K, parts[p].w, parts[p].N, parts[p].bias, parts[p].y);
    return;
  }
  // The parts' tiles numbered one after another; each thread takes a contiguous run of them, as
  // matmul_impl splits one weight's tiles.
  const int64_t align = M == 1 ? kNR1 : kNR;
  int64_t tiles = 0, cols = 0;
  for (int64_t p = 0; p < n_parts; ++p) {
    tiles += (parts[p].N + align - 1) / align;
    cols += parts[p].N;
  }
  if (tiles == 0) return;
  int nt = num_threads();
  if (static_cast<double>(M) * cols * K < 64.0 * 1024) nt = 1;
  nt = static_cast<int>(std::min<int64_t>(nt, tiles));
  auto run = [&](int64_t t0, int64_t t1) {
    int64_t first = 0;  // the global number of part p's first tile
    for (int64_t p = 0; p < n_parts && first < t1; ++p) {
      const MatmulPart<WT>& part = parts[p];
      const int64_t pt = (part.N + align - 1) / align;
      const int64_t a = std::max(t0, first) - first, b = std::min(t1, first + pt) - first;
      if (a < b)
        matmul_range(x, M, K, part.w, part.bias, part.y, part.N, std::min(part.N, a * align),
                     std::min(part.N, b * align));
      first += pt;
    }
  };
  if (nt <= 1) {
    run(0, tiles);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int T = omp_get_num_threads();
    run(tiles * t / T, tiles * (t + 1) / T);
  }
}

// Work items of a grouped matmul: a group's rows times a column range of its weight.
struct GroupItem {
  int64_t g, n0, n1;
};

template <typename WT>
void grouped_impl(const float* x, const int64_t* offsets, int64_t G, int64_t K, const WT* const* w, int64_t N,
                  float* y) {
  if (N <= 0 || G <= 0) return;
  int64_t rows = 0, live = 0;
  for (int64_t g = 0; g < G; ++g) {
    rows += offsets[g + 1] - offsets[g];
    live += offsets[g + 1] > offsets[g];
  }
  if (rows == 0) return;
  if (K <= 0) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) std::fill(y + r * N, y + (r + 1) * N, 0.0f);
    return;
  }
  int nt = num_threads();
  if (static_cast<double>(rows) * N * K < 64.0 * 1024) nt = 1;
  // Column ranges of whole tiles (kNR1 wide for one-row groups, kNR otherwise), split like
  // matmul_*. With few groups each is cut into as many ranges as threads (every range re-reads the
  // group's rows, so no more than needed); with many, about 4 items per thread overall.
  const int64_t per_group_max = std::max<int64_t>(1, std::min<int64_t>(nt, (4 * nt + live - 1) / live));
  std::vector<GroupItem> items;
  items.reserve(static_cast<size_t>(live * per_group_max));
  for (int64_t g = 0; g < G; ++g) {
    const int64_t M = offsets[g + 1] - offsets[g];
    if (M == 0) continue;
    const int64_t align = M == 1 ? kNR1 : kNR;
    const int64_t tiles = (N + align - 1) / align;
    const int64_t parts = std::min(per_group_max, tiles);
    for (int64_t i = 0; i < parts; ++i) {
      const int64_t n0 = std::min(N, tiles * i / parts * align);
      const int64_t n1 = std::min(N, tiles * (i + 1) / parts * align);
      if (n0 < n1) items.push_back({g, n0, n1});
    }
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
  for (int64_t i = 0; i < n_items; ++i) {
    const GroupItem& it = items[static_cast<size_t>(i)];
    const int64_t r0 = offsets[it.g];
    matmul_range(x + r0 * K, offsets[it.g + 1] - r0, K, w[it.g], nullptr, y + r0 * N, N, it.n0, it.n1);
  }
}

}  // namespace

void grouped_matmul_f32w(const float* x, const int64_t* offsets, int64_t G, int64_t K, const float* const* w,
                         int64_t N, float* y) {
  grouped_impl<float>(x, offsets, G, K, w, N, y);
}

void grouped_matmul_bf16w(const float* x, const int64_t* offsets, int64_t G, int64_t K, const uint16_t* const* w,
                          int64_t N, float* y) {
  grouped_impl<uint16_t>(x, offsets, G, K, w, N, y);
}

void matmul_parts_f32w(const float* x, int64_t M, int64_t K, const MatmulPart<float>* parts, int64_t n_parts) {
  matmul_parts_impl<float>(x, M, K, parts, n_parts);
}

void matmul_parts_bf16w(const float* x, int64_t M, int64_t K, const MatmulPart<uint16_t>* parts, int64_t n_parts) {
  matmul_parts_impl<uint16_t>(x, M, K, parts, n_parts);
}

void matmul_f32w(const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias, float* y) {
  matmul_impl<float>(x, M, K, w, N, bias, y);
}

void matmul_bf16w(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, const float* bias,
                  float* y) {
  matmul_impl<uint16_t>(x, M, K, w, N, bias, y);
}

}  // namespace shardlm::cpu
