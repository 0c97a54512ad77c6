// bench_kernels: machine ceilings (memory bandwidth, fp32 FMA peak) and CPU matmul throughput for
// the shapes of a hidden-1024 model with bf16 weights. A program, not a test.
//
//   bench_kernels [--threads N] [--quick]
//
// Every number is the best of several repetitions (other work on the machine only slows runs down).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/threads.h"

#if defined(__AVX512F__) || defined(__AVX2__)
// GCC 12 warns falsely about _mm256_undefined_*() inside the AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

using namespace shardlm;
using clk = std::chrono::steady_clock;

namespace {

double now_s() { return std::chrono::duration<double>(clk::now().time_since_epoch()).count(); }

template <typename T>
T* aligned(size_t n) {
  return static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
}

volatile uint64_t g_sink;
volatile float g_fsink;

// Read-only streaming sum over a 1 GiB buffer on all threads; GB/s. The buffer is walked in
// 64 MiB chunks (twice L3) each timed on its own, and the best chunk rate over the repetitions is
// kept: on a shared machine a whole-buffer pass is rarely undisturbed. Two loop variants: a plain
// sum, and one with software prefetch 4 KiB ahead (as the M=1 matmul does); the ceiling is the
// better of the two.
struct Bandwidth {
  double plain, prefetched;
};
Bandwidth measure_bandwidth(int reps) {
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
double measure_fma_peak(int reps) {
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
  const double flops = 2.0 * 12 * lanes * iters * cpu::num_threads();
  return flops / best / 1e9;
}

struct Shape {
  int64_t N, K;
  const char* what;
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) cpu::set_num_threads(std::atoi(argv[++i]));
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: bench_kernels [--threads N] [--quick]\n");
      return 2;
    }
  }
  const int threads = cpu::num_threads();
#if defined(__AVX512F__)
  const char* isa = "AVX-512";
#elif defined(__AVX2__)
  const char* isa = "AVX2";
#else
  const char* isa = "scalar";
#endif
  std::printf("bench_kernels: %d threads, matmul path %s\n", threads, isa);

  // Ceilings are measured before and after the matmuls and the better value kept (other work on
  // the machine only ever lowers a measurement).
  Bandwidth bws = measure_bandwidth(quick ? 2 : 4);
  double peak = measure_fma_peak(quick ? 100 : 300);
  const Shape shapes[] = {{1024, 1024, "attn q/o"}, {2816, 1024, "mlp gate/up"}, {1024, 2816, "mlp down"},
                          {32000, 1024, "lm head"}};
  const int64_t Ms[] = {1, 64, 512};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  const int64_t maxMK = 512 * 2816, maxMN = 512 * 32000;
  float* x = aligned<float>(maxMK);
  float* y = aligned<float>(maxMN);
  for (int64_t i = 0; i < maxMK; ++i) x[i] = U(rng);
  // A 256 MiB pool of bf16 weights; successive runs take successive slices so M=1 runs stream
  // from memory, not from L3 (32 MiB), as decode does with a 0.5 GB model.
  const int64_t pool_n = int64_t(128) << 20;
  uint16_t* pool = aligned<uint16_t>(pool_n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pool_n; ++i) {
    const float f = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    pool[i] = static_cast<uint16_t>(u >> 16);
  }
  // Shapes are measured in interleaved rounds and the best time per shape is kept, so that a
  // burst of other work on the machine does not spoil a whole shape.
  const int rounds = quick ? 2 : 5;
  const double round_s = quick ? 0.1 : 0.2;
  const size_t nshape = std::size(Ms) * std::size(shapes);
  std::vector<double> best(nshape, 1e30);
  for (int r = 0; r < rounds; ++r) {
    size_t idx = 0;
    for (int64_t M : Ms) {
      for (const Shape& s : shapes) {
        double spent = 0;
        int it = 0;
        const int64_t slices = pool_n / (s.N * s.K);
        while ((spent < round_s || it < 3) && it < 2000) {
          const uint16_t* w = pool + ((it + r * 7) % slices) * (s.N * s.K);
          const double t0 = now_s();
          cpu::matmul_bf16w(x, M, s.K, w, s.N, nullptr, y);
          const double t = now_s() - t0;
          if (it > 0 || r > 0) best[idx] = std::min(best[idx], t);  // the very first run warms up
          spent += t;
          ++it;
        }
        ++idx;
      }
    }
  }
  {
    const Bandwidth b2 = measure_bandwidth(quick ? 2 : 4);
    bws.plain = std::max(bws.plain, b2.plain);
    bws.prefetched = std::max(bws.prefetched, b2.prefetched);
    peak = std::max(peak, measure_fma_peak(quick ? 100 : 300));
  }
  const double bw = std::max(bws.plain, bws.prefetched);
  std::printf("(1) memory bandwidth (1 GiB read-only sum, best 64 MiB chunk, %d threads): %.1f GB/s  (plain loop %.1f, "
              "with software prefetch %.1f)\n",
              threads, bw, bws.plain, bws.prefetched);
  std::printf("(2) fp32 FMA peak (register-resident, %d threads):    %.1f GFLOP/s\n", threads, peak);
  std::printf("(3) matmul y[M,N] = x[M,K] W[N,K]^T, bf16 W, fp32 x/y (best of repeats)\n");
  std::printf("    %-12s %5s %6s %6s %10s %9s %9s   %s\n", "layer", "M", "N", "K", "time_us", "GFLOP/s",
              "GB/s", "vs ceiling");
  size_t idx = 0;
  for (int64_t M : Ms) {
    for (const Shape& s : shapes) {
      const double flops = 2.0 * M * s.N * s.K;
      const double bytes = 2.0 * s.N * s.K + 4.0 * M * s.K + 4.0 * M * s.N;
      const double t = best[idx++];
      const double gf = flops / t / 1e9, gb = bytes / t / 1e9;
      char ceil[96];
      if (M == 1)
        std::snprintf(ceil, sizeof ceil, "%5.1f%% of bandwidth", 100.0 * gb / bw);
      else
        std::snprintf(ceil, sizeof ceil, "%5.1f%% of FMA peak", 100.0 * gf / peak);
      std::printf("    %-12s %5ld %6ld %6ld %10.1f %9.1f %9.1f   %s\n", s.what, static_cast<long>(M),
                  static_cast<long>(s.N), static_cast<long>(s.K), t * 1e6, gf, gb, ceil);
    }
  }
  // (4) What these matmul times imply for a hidden-1024 model (14 layers of q/k/v/o 1024x1024,
  // gate/up 2816x1024, down 1024x2816, plus the 32000x1024 lm head: ~245M parameters), matmuls
  // only (no attention, norms or framework overhead).
  std::printf("(4) implied matmul-only throughput, hidden-1024 model (14 layers + lm head, bf16):\n");
  for (size_t mi = 0; mi < std::size(Ms); ++mi) {
    const double* t = &best[mi * std::size(shapes)];
    const double per_step = 14.0 * (4.0 * t[0] + 2.0 * t[1] + t[2]) + t[3];
    const char* what = Ms[mi] == 1 ? "decode, batch 1" : Ms[mi] == 64 ? "batched decode, 64 sequences" : "prefill, 512-token chunk";
    std::printf("    M=%-4ld %-30s %8.1f tok/s\n", static_cast<long>(Ms[mi]), what, Ms[mi] / per_step);
  }
  std::free(pool);
  std::free(x);
  std::free(y);
  return 0;
}
