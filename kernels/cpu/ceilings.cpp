#include "cpu/ceilings.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "cpu/threads.h"

#if defined(__AVX512F__) || defined(__AVX2__)
// GCC 12 warns falsely about _mm256_undefined_*() inside the AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace shardlm::cpu {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <typename T>
T* aligned(size_t n) {
  return static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
}

// Sinks keep the compiler from deleting the measured loops.
volatile uint64_t g_sink;
volatile float g_fsink;

}  // namespace


// Read-only streaming sum over a 1 GiB buffer on all threads; GB/s. The buffer is walked in
// 64 MiB chunks (twice L3) each timed on its own, and the best chunk rate over the repetitions is
// kept: on a shared machine a whole-buffer pass is rarely undisturbed. Two loop variants: a plain
// sum, and one with software prefetch 4 KiB ahead (as the M=1 matmul does); the ceiling is the
// better of the two.
MemoryBandwidth measure_memory_bandwidth(int reps) {
  const size_t bytes = size_t(1) << 30, chunk_bytes = size_t(64) << 20;
  const size_t n = bytes / sizeof(uint64_t), cn = chunk_bytes / sizeof(uint64_t);
  uint64_t* buf = aligned<uint64_t>(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  double best_plain = 1e30, best_pf = 1e30;
  for (int r = 0; r < reps; ++r) {
    for (size_t c0 = 0; c0 < n; c0 += cn) {
      const uint64_t* b = buf + c0;
      uint64_t total = 0;
      double t0 = now_s();
#pragma omp parallel for schedule(static) reduction(+ : total)
      for (size_t i = 0; i < cn; ++i) total += b[i];
      best_plain = std::min(best_plain, now_s() - t0);
      g_sink = total;
    }
    for (size_t c0 = 0; c0 < n; c0 += cn) {
      const uint64_t* b = buf + c0;
      uint64_t total = 0;
      double t0 = now_s();
#pragma omp parallel reduction(+ : total)
      {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const size_t lo = cn * t / T / 32 * 32, hi = cn * (t + 1) / T / 32 * 32;
        uint64_t acc[32] = {};
        for (size_t i = lo; i < hi; i += 32) {
          const char* p = reinterpret_cast<const char*>(b + i) + 4096;
          __builtin_prefetch(p, 0, 2);
          __builtin_prefetch(p + 64, 0, 2);
          __builtin_prefetch(p + 128, 0, 2);
          __builtin_prefetch(p + 192, 0, 2);
          for (int j = 0; j < 32; ++j) acc[j] += b[i + j];
        }
        for (int j = 0; j < 32; ++j) total += acc[j];
      }
      best_pf = std::min(best_pf, now_s() - t0);
      g_sink = total;
    }
  }
  std::free(buf);
  return {chunk_bytes / best_plain / 1e9, chunk_bytes / best_pf / 1e9};
}

// Register-resident FMA loop on all threads; GFLOP/s.
double measure_fma_peak_gflops(int reps) {
  const int64_t iters = 200'000;  // ~0.7 ms: short runs find quiet windows
  double best = 1e30;
  int lanes = 1;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
#pragma omp parallel
    {
#if defined(__AVX512F__)
      const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
      __m512 a0 = _mm512_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
             a8 = a0, a9 = a0, a10 = a0, a11 = a0;
      for (int64_t it = 0; it < iters; ++it) {
        a0 = _mm512_fmadd_ps(a0, b, c); a1 = _mm512_fmadd_ps(a1, b, c); a2 = _mm512_fmadd_ps(a2, b, c);
        a3 = _mm512_fmadd_ps(a3, b, c); a4 = _mm512_fmadd_ps(a4, b, c); a5 = _mm512_fmadd_ps(a5, b, c);
        a6 = _mm512_fmadd_ps(a6, b, c); a7 = _mm512_fmadd_ps(a7, b, c); a8 = _mm512_fmadd_ps(a8, b, c);
        a9 = _mm512_fmadd_ps(a9, b, c); a10 = _mm512_fmadd_ps(a10, b, c); a11 = _mm512_fmadd_ps(a11, b, c);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                         "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
      }
      __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                               _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
      s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
      g_fsink = _mm512_reduce_add_ps(s);
#pragma omp single
      lanes = 16;
#elif defined(__AVX2__) && defined(__FMA__)
      const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
      __m256 a0 = _mm256_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
             a8 = a0, a9 = a0, a10 = a0, a11 = a0;
      for (int64_t it = 0; it < iters; ++it) {
        a0 = _mm256_fmadd_ps(a0, b, c); a1 = _mm256_fmadd_ps(a1, b, c); a2 = _mm256_fmadd_ps(a2, b, c);
        a3 = _mm256_fmadd_ps(a3, b, c); a4 = _mm256_fmadd_ps(a4, b, c); a5 = _mm256_fmadd_ps(a5, b, c);
        a6 = _mm256_fmadd_ps(a6, b, c); a7 = _mm256_fmadd_ps(a7, b, c); a8 = _mm256_fmadd_ps(a8, b, c);
        a9 = _mm256_fmadd_ps(a9, b, c); a10 = _mm256_fmadd_ps(a10, b, c); a11 = _mm256_fmadd_ps(a11, b, c);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7),
                         "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
      }
      __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                               _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
      s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
      float tmp[8];
      _mm256_storeu_ps(tmp, s);
      g_fsink = tmp[0];
#pragma omp single
      lanes = 8;
#else
      float a[12];
      for (int i = 0; i < 12; ++i) a[i] = 1.0f + i * 1e-3f;
      for (int64_t it = 0; it < iters; ++it)
        for (int i = 0; i < 12; ++i) a[i] = std::fma(a[i], 0.999999f, 1e-7f);
      g_fsink = a[0];
#endif
    }
    best = std::min(best, now_s() - t0);
  }
  const double flops = 2.0 * 12 * lanes * iters * num_threads();
  return flops / best / 1e9;
}

}  // namespace shardlm::cpu
