#include "cli/bench_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/kv_cache.h"
#include "engine/rng.h"
#include "fp8_bits.h"

namespace shardlm {

namespace {

constexpr int64_t kBlock = 16;                        // cache block size (positions)
constexpr int64_t kMaxCacheBytes = int64_t{2} << 30;  // K and V of the largest shape timed
constexpr int64_t kChunk = 512;                       // prefill tokens per call (at most)
constexpr double kRunSeconds = 0.1;                   // a timed run of calls (about)

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

// The op's shape: GQA (K and V rows of n_kv_heads * head_dim) or MLA (one cache of latent rows,
// kv_lora + rope floats, every head reading them).
struct Shape {
  bool mla;
  int64_t heads, kv_heads, head_dim;  // GQA
  int64_t kv_lora, rope;              // MLA
  explicit Shape(const ModelSpec& spec)
      : mla(spec.mla.enabled()),
        heads(spec.num_heads),
        kv_heads(spec.num_kv_heads),
        head_dim(spec.head_dim),
        kv_lora(spec.mla.kv_lora_rank),
        rope(spec.mla.qk_rope_head_dim) {}
  // Floats cached per position (K and V together), of the queries and of the output per token.
  int64_t cache_row() const { return mla ? kv_lora + rope : 2 * kv_heads * head_dim; }
  int64_t q_floats() const { return heads * (mla ? kv_lora + rope : head_dim); }
  int64_t out_floats() const { return heads * (mla ? kv_lora : head_dim); }
  // FLOP per attended position per head: the score's dot product and the output's share.
  double flop_per_position() const {
    return mla ? 2.0 * static_cast<double>(kv_lora + rope) + 2.0 * static_cast<double>(kv_lora)
               : 4.0 * static_cast<double>(head_dim);
  }
};

// A cache of `slots` random rows of `dtype` (F32, BF16, or F8_E4M3 with scale 1) in blocks 0, 1,
// ... (GQA: K then V, MLA: latent rows) and random queries for up to max_t tokens, in backend
// memory; time_us runs one attention call over it.
class Rig {
 public:
  Rig(ComputeBackend& b, const Shape& shape, int64_t slots, int64_t max_t, DType dtype)
      : b_(b),
        s_(shape),
        slots_(slots),
        dtype_(dtype),
        cache_(b, static_cast<size_t>(slots * s_.cache_row()) * dtype_size(dtype)),
        q_(b, static_cast<size_t>(max_t * s_.q_floats()) * sizeof(float)),
        out_(b, static_cast<size_t>(max_t * s_.out_floats()) * sizeof(float)),
        blocks_(static_cast<size_t>(slots / kBlock)),
        d_blocks_(b, blocks_.size() * sizeof(int32_t)),
        d_start_(b, max_t * sizeof(int32_t)),
        d_pos_(b, max_t * sizeof(int32_t)) {
    std::vector<float> host(static_cast<size_t>(slots * s_.cache_row()));
    fill_random(host, 1);
    if (dtype == DType::BF16) {
      std::vector<uint16_t> narrow(host.size());
      for (size_t i = 0; i < host.size(); ++i) narrow[i] = f32_to_bf16(host[i]);
      b.copy_to_device(cache_.p, narrow.data(), narrow.size() * sizeof(uint16_t));
    } else if (dtype == DType::F8_E4M3) {
      std::vector<uint8_t> codes(host.size());
      for (size_t i = 0; i < host.size(); ++i) codes[i] = fp8_bits::from_f32(host[i]);
      b.copy_to_device(cache_.p, codes.data(), codes.size());
    } else {
      b.copy_to_device(cache_.p, host.data(), host.size() * sizeof(float));
    }
    host.assign(static_cast<size_t>(max_t * s_.q_floats()), 0.0f);
    fill_random(host, 3);
    b.copy_to_device(q_.p, host.data(), host.size() * sizeof(float));
    for (size_t i = 0; i < blocks_.size(); ++i) blocks_[i] = static_cast<int32_t>(i);
    b.copy_to_device(d_blocks_.p, blocks_.data(), blocks_.size() * sizeof(int32_t));
  }

  // Token t reads the sequence whose blocks start at start[t] and sits at pos[t].
  void set_tokens(const std::vector<int32_t>& start, const std::vector<int32_t>& pos) {
    start_ = start;
    pos_ = pos;
    b_.copy_to_device(d_start_.p, start.data(), start.size() * sizeof(int32_t));
    b_.copy_to_device(d_pos_.p, pos.data(), pos.size() * sizeof(int32_t));
  }

  // Microseconds per call, best of 3 runs of up to `iters` calls after a warm-up call: as many as
  // take about kRunSeconds at the warm-up's pace, at least one (a CPU call over a long context
  // takes a quarter of a second; a GPU one microseconds). max_pos is the tables' bound on the
  // positions (-1: none); host_tables: whether the tables carry their host copies (as an eager
  // step's do; CUDA tiles prefill chunks only then).
  double time_us(int64_t max_pos, int iters, bool host_tables = true) {
    const int64_t T = static_cast<int64_t>(pos_.size());
    const BlockTables tables{d_blocks_.i(), d_start_.i(), host_tables ? blocks_.data() : nullptr,
                             host_tables ? start_.data() : nullptr, max_pos};
    float* q = q_.f();
    // GQA: the V side follows the K side's slots rows.
    char* k = static_cast<char*>(cache_.p);
    const KvCacheRef cache{k, s_.mla ? nullptr : k + slots_ * s_.kv_heads * s_.head_dim * dtype_size(dtype_), dtype_};
    auto call = [&] {
      if (s_.mla) {
        b_.latent_attention(q, q + T * s_.heads * s_.kv_lora, T, s_.heads, s_.kv_lora, s_.rope, cache, kBlock, tables,
                            d_pos_.i(), 0.1f, out_.f());
      } else {
        const int64_t hd = s_.head_dim;
        b_.attention(q, T, s_.heads, s_.kv_heads, hd, cache, kBlock, tables, d_pos_.i(), 0,
                     1.0f / std::sqrt(static_cast<float>(hd)), out_.f());
      }
    };
    const auto warm = std::chrono::steady_clock::now();
    call();
    b_.synchronize();
    const double warm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - warm).count();
    if (warm_s * iters > kRunSeconds) iters = std::max(1, static_cast<int>(kRunSeconds / warm_s));
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) call();
      b_.synchronize();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
    return best * 1e6;
  }

  // What the last call launched: the split along positions, whether it tiled a prefill chunk's
  // tokens.
  int64_t last_parts() const { return b_.last_attention_parts(); }
  bool last_tiled() const { return b_.last_attention_tiled(); }
  bool last_bf16() const { return b_.last_attention_bf16(); }

 private:
  ComputeBackend& b_;
  Shape s_;
  int64_t slots_;
  DType dtype_;
  Buffer cache_, q_, out_;
  std::vector<int32_t> blocks_, start_, pos_;
  Buffer d_blocks_, d_start_, d_pos_;
};

std::string describe(const Shape& s) {
  char buf[160];
  if (s.mla) {
    std::snprintf(buf, sizeof buf, "MLA, %lld heads on a latent cache of %lld + %lld floats",
                  static_cast<long long>(s.heads), static_cast<long long>(s.kv_lora), static_cast<long long>(s.rope));
  } else {
    std::snprintf(buf, sizeof buf, "%lld heads / %lld KV heads, head_dim %lld", static_cast<long long>(s.heads),
                  static_cast<long long>(s.kv_heads), static_cast<long long>(s.head_dim));
  }
  return buf;
}

// The short context (4096) and the long one, in increasing order, without repeats.
std::vector<int64_t> decode_contexts(int64_t longest) {
  std::vector<int64_t> c = {std::min<int64_t>(4096, longest)};
  if (longest > c[0]) c.push_back(longest);
  return c;
}

// GFLOP/s, and the share of peak when it is known.
std::string rate(double flop, double us, double peak, const char* peak_name) {
  char buf[96];
  const double gflops = flop / us / 1e3;
  if (peak > 0) {
    std::snprintf(buf, sizeof buf, "%.1f GFLOP/s, %.1f%% of the %s peak", gflops, 100.0 * gflops / peak, peak_name);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GFLOP/s", gflops);
  }
  return buf;
}

// MLA decode's arithmetic beside its bytes: every head scores and sums each latent row, about 30
// FLOP a byte of a bf16 row for 16 heads, so the units' peak can bind before the bandwidth (it
// does on the CPU and on a GPU's fp32 cores); GQA decode, a few FLOP a byte, is bound by bytes.
std::string mla_rate(const Shape& sh, bool mla_bf16, const AttentionPeaks& peaks, double flop, double us) {
  if (!sh.mla) return "";
  return "; " +
         (mla_bf16 ? rate(flop, us, peaks.bf16_gflops, "bf16 tensor") : rate(flop, us, peaks.fp32_gflops, "fp32"));
}

void print_decode(ComputeBackend& b, const Shape& sh, double bw_gbs, const AttentionPeaks& peaks, DType dtype,
                  int64_t longest) {
  const int64_t row_bytes = sh.cache_row() * static_cast<int64_t>(dtype_size(dtype));
  // (sequences, cached positions): lone decode and a small batch, at a short and a long context;
  // those whose cache takes more than kMaxCacheBytes are left out (a model with many KV heads).
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t T : {1, 8}) {
    for (int64_t ctx : decode_contexts(longest))
      if (T * ctx * row_bytes <= kMaxCacheBytes) shapes.emplace_back(T, ctx);
  }
  if (shapes.empty()) {
    std::printf("attention decode: not timed (one %lld-position sequence's cache is over %lld MiB)\n",
                static_cast<long long>(decode_contexts(longest)[0]), static_cast<long long>(kMaxCacheBytes >> 20));
    return;
  }
  int64_t max_slots = 0, max_t = 0;
  for (auto [T, ctx] : shapes) max_slots = std::max(max_slots, T * ctx), max_t = std::max(max_t, T);
  Rig rig(b, sh, max_slots, max_t, dtype);
  std::printf("attention decode (%s, %s cache; cache read per call against %.0f GB/s):\n", describe(sh).c_str(),
              kv_dtype_name(dtype), bw_gbs);
  for (const auto& shape : shapes) {
    const int64_t T = shape.first, ctx = shape.second;
    // Sequence t holds blocks [t * ctx / kBlock, (t + 1) * ctx / kBlock); its token decodes at ctx - 1.
    std::vector<int32_t> start(T), pos(T, static_cast<int32_t>(ctx - 1));
    for (int64_t t = 0; t < T; ++t) start[t] = static_cast<int32_t>(t * ctx / kBlock);
    rig.set_tokens(start, pos);
    const double bytes = static_cast<double>(T * ctx * row_bytes);
    const double flop = static_cast<double>(T * ctx * sh.heads) * sh.flop_per_position();
    const int iters = bytes > 1e9 ? 3 : 20;
    const double us = rig.time_us(ctx - 1, iters);
    const bool bf16 = rig.last_bf16();
    std::printf("  %lld x %6lld positions: %10.1f us  (%7.1f GB/s, %5.1f%% of bandwidth%s)", static_cast<long long>(T),
                static_cast<long long>(ctx), us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / bw_gbs,
                mla_rate(sh, bf16, peaks, flop, us).c_str());
    const int64_t parts = rig.last_parts();
    if (parts > 1) {
      const double unsplit = rig.time_us(-1, iters);  // no bound: unsplit
      std::printf("  split %lld ways; unsplit %.1f us (%.1f GB/s)", static_cast<long long>(parts), unsplit,
                  bytes / unsplit / 1e3);
    }
    if (bf16) {  // MLA decode on tensor cores (--decode-attention bf16): beside the fp32 kernel
      b.set_decode_attention_bf16(false);
      const double fp32_us = rig.time_us(ctx - 1, iters);
      b.set_decode_attention_bf16(true);
      std::printf("%s bf16 tensor cores; fp32 kernel %.1f us (%.1f GB/s%s), %.1fx", parts > 1 ? ";" : " ", fp32_us,
                  bytes / fp32_us / 1e3, mla_rate(sh, false, peaks, flop, fp32_us).c_str(), fp32_us / us);
    }
    std::printf("\n");
  }
}

void print_prefill(ComputeBackend& b, const Shape& sh, const AttentionPeaks& peaks, DType dtype, int64_t longest) {
  const int64_t row_bytes = sh.cache_row() * static_cast<int64_t>(dtype_size(dtype));
  const int64_t chunk = std::min(kChunk, longest);
  std::vector<int64_t> contexts;  // the chunk is the last `chunk` positions of each
  for (int64_t ctx : {chunk, std::min<int64_t>(4096, longest)}) {
    if (ctx * row_bytes <= kMaxCacheBytes && (contexts.empty() || ctx > contexts.back())) contexts.push_back(ctx);
  }
  if (contexts.empty()) return;
  Rig rig(b, sh, contexts.back(), chunk, dtype);
  std::printf(
      "attention prefill (%s, %s cache; %lld-token chunks of one sequence, FLOPs against the peak of "
      "the units that ran them",
      describe(sh).c_str(), kv_dtype_name(dtype), static_cast<long long>(chunk));
  if (peaks.fp32_gflops > 0) std::printf(": fp32 %.0f GFLOP/s", peaks.fp32_gflops);
  if (peaks.bf16_gflops > 0) std::printf(", bf16 tensor %.0f GFLOP/s", peaks.bf16_gflops);
  std::printf("):\n");
  const bool bf16_on = b.prefill_attention_bf16();
  for (int64_t ctx : contexts) {
    std::vector<int32_t> start(chunk, 0), pos(chunk);
    for (int64_t t = 0; t < chunk; ++t) pos[t] = static_cast<int32_t>(ctx - chunk + t);
    rig.set_tokens(start, pos);
    double attended = 0;  // (token, position) pairs: token t attends to pos[t] + 1 positions
    for (int32_t p : pos) attended += p + 1.0;
    const double flop = attended * static_cast<double>(sh.heads) * sh.flop_per_position();
    const int iters = flop > 2e10 ? 3 : 10;
    const double us = rig.time_us(ctx - 1, iters);
    const bool bf16 = rig.last_bf16();
    char span[48];
    std::snprintf(span, sizeof span, "%lld..%lld", static_cast<long long>(ctx - chunk),
                  static_cast<long long>(ctx - 1));
    std::printf("  positions %-11s: %10.1f us  (%s)", span, us,
                bf16 ? rate(flop, us, peaks.bf16_gflops, "bf16 tensor").c_str()
                     : rate(flop, us, peaks.fp32_gflops, "fp32").c_str());
    bool tiled = rig.last_tiled();
    if (bf16) {  // beside the fp32 kernels the backend runs with --prefill-attention fp32
      b.set_prefill_attention_bf16(false);
      const double fp32_us = rig.time_us(ctx - 1, iters);
      tiled = rig.last_tiled();
      b.set_prefill_attention_bf16(bf16_on);
      std::printf("  bf16 tensor cores; fp32 %s kernel %.1f us (%s), %.1fx", tiled ? "tiled" : "per-token", fp32_us,
                  rate(flop, fp32_us, peaks.fp32_gflops, "fp32").c_str(), fp32_us / us);
    }
    if (tiled) {
      const double per_token = rig.time_us(ctx - 1, iters, /*host_tables=*/false);
      std::printf("%s per-token kernel %.1f us (%.1f GFLOP/s)", bf16 ? ";" : "  tiled;", per_token,
                  flop / per_token / 1e3);
    }
    std::printf("\n");
  }
}

}  // namespace

void print_attention_bench(ComputeBackend& b, const ModelSpec& spec, double bw_gbs, const AttentionPeaks& peaks,
                           int64_t longest_context) {
  SHARDLM_CHECK(longest_context > 0, "attention bench: the longest context must be positive, not " << longest_context);
  const Shape shape(spec);
  for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3})
    print_decode(b, shape, bw_gbs, peaks, dtype, longest_context);
  for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3}) print_prefill(b, shape, peaks, dtype, longest_context);
}

}  // namespace shardlm
