#include "cli/bench_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "engine/rng.h"
#ifdef SHARDLM_HAVE_CUDA
#include "compute/cuda_backend.h"
#endif

namespace shardlm {

namespace {

constexpr int64_t kBlock = 16;                        // cache block size (positions)
constexpr int64_t kMaxCacheBytes = int64_t{2} << 30;  // K and V of the largest shape timed

// Backend memory that frees itself.
struct Buffer {
  ComputeBackend& b;
  void* p;
  Buffer(ComputeBackend& backend, size_t bytes) : b(backend), p(backend.alloc(bytes)) {}
  ~Buffer() { b.free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
  int32_t* i() const { return static_cast<int32_t*>(p); }
};

// Uniform values in [-1, 1) from a counter hash: cheap enough for a cache of a few GB.
void fill_random(std::vector<float>& v, uint64_t seed) {
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(static_cast<double>(mix64(seed * 0x9E3779B97F4A7C15ull + i) >> 11) * 0x1.0p-52 - 1.0);
}

}  // namespace

void print_attention_bench(ComputeBackend& b, const ModelSpec& spec, double bw_gbs) {
  if (spec.mla.enabled()) return;
  const int64_t nh = spec.num_heads, nkv = spec.num_kv_heads, hd = spec.head_dim, row = nkv * hd;
  // (sequences, cached positions): lone decode and a small batch, at a short and a long context;
  // those whose K and V take more than kMaxCacheBytes are left out (a model with many KV heads).
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (auto [T, ctx] : {std::pair<int64_t, int64_t>{1, 4096}, {1, 32768}, {8, 4096}, {8, 32768}}) {
    if (2 * T * ctx * row * static_cast<int64_t>(sizeof(float)) <= kMaxCacheBytes) shapes.emplace_back(T, ctx);
  }
  if (shapes.empty()) {
    std::printf("attention decode: not timed (one 4096-position sequence's K/V is over %lld MiB)\n",
                static_cast<long long>(kMaxCacheBytes >> 20));
    return;
  }
  int64_t max_slots = 0, max_t = 0;
  for (auto [T, ctx] : shapes) max_slots = std::max(max_slots, T * ctx), max_t = std::max(max_t, T);
  std::vector<float> host(static_cast<size_t>(max_slots * row));
  Buffer k(b, host.size() * sizeof(float)), v(b, host.size() * sizeof(float));
  fill_random(host, 1);
  b.copy_to_device(k.p, host.data(), host.size() * sizeof(float));
  fill_random(host, 2);
  b.copy_to_device(v.p, host.data(), host.size() * sizeof(float));
  host.assign(static_cast<size_t>(max_t * nh * hd), 0.0f);
  fill_random(host, 3);
  Buffer q(b, host.size() * sizeof(float)), out(b, host.size() * sizeof(float));
  b.copy_to_device(q.p, host.data(), host.size() * sizeof(float));
  std::vector<int32_t> blocks(static_cast<size_t>(max_slots / kBlock));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  Buffer d_blocks(b, blocks.size() * sizeof(int32_t)), d_start(b, max_t * sizeof(int32_t)),
      d_pos(b, max_t * sizeof(int32_t));
  b.copy_to_device(d_blocks.p, blocks.data(), blocks.size() * sizeof(int32_t));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  std::printf(
      "attention decode (%lld heads / %lld KV heads, head_dim %lld, fp32 cache; K/V read per call "
      "against %.0f GB/s):\n",
      static_cast<long long>(nh), static_cast<long long>(nkv), static_cast<long long>(hd), bw_gbs);
  for (const auto& shape : shapes) {
    const int64_t T = shape.first, ctx = shape.second;  // lambdas below capture them (not bindings)
    // Sequence t holds blocks [t * ctx / kBlock, (t + 1) * ctx / kBlock); its token decodes at ctx - 1.
    std::vector<int32_t> start(T), pos(T, static_cast<int32_t>(ctx - 1));
    for (int64_t t = 0; t < T; ++t) start[t] = static_cast<int32_t>(t * ctx / kBlock);
    b.copy_to_device(d_start.p, start.data(), T * sizeof(int32_t));
    b.copy_to_device(d_pos.p, pos.data(), T * sizeof(int32_t));
    const double bytes = 2.0 * static_cast<double>(T * ctx * row) * sizeof(float);
    // us per call, best of 3 runs of `iters` calls after a warm-up call.
    auto time_us = [&](int64_t max_pos) {
      const BlockTables tables{d_blocks.i(), d_start.i(), blocks.data(), start.data(), max_pos};
      auto call = [&] {
        b.attention(q.f(), T, nh, nkv, hd, k.f(), v.f(), kBlock, tables, d_pos.i(), 0, scale, out.f());
      };
      call();
      b.synchronize();
      const int iters = bytes > 1e9 ? 3 : 20;
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) call();
        b.synchronize();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
      return best * 1e6;
    };
    const double us = time_us(ctx - 1);
    std::printf("  %lld x %6lld positions: %10.1f us  (%7.1f GB/s, %5.1f%% of bandwidth)", static_cast<long long>(T),
                static_cast<long long>(ctx), us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / bw_gbs);
#ifdef SHARDLM_HAVE_CUDA
    if (auto* gpu = dynamic_cast<CudaBackend*>(&b)) {
      const int64_t parts = gpu->last_attention_parts();
      if (parts > 1) {
        const double unsplit = time_us(-1);  // no bound: unsplit
        std::printf("  split %lld ways; unsplit %.1f us (%.1f GB/s)", static_cast<long long>(parts), unsplit,
                    bytes / unsplit / 1e3);
      }
    }
#endif
    std::printf("\n");
  }
}

}  // namespace shardlm
