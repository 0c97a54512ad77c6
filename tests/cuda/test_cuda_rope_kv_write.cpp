// The fused launches between a layer's projections and its attention, against the separate
// launches they replace, memcmp-equal, across cache types, padding slots and positions, and one
// graph node when captured:
//  - CudaBackend::rope_kv_write (GQA): Qwen3's q/k norms, rope and the KV cache write; head widths
//    from one element a lane to several per rmsnorm thread; q and k against the CPU backend too;
//  - CudaBackend::latent_rope_cache_write (MLA): the latent's norm, the rope key's and queries'
//    ropes (rotate-half and interleaved, with YaRN's attention factor) and the latent cache write.
// Skips without a GPU (and runs on the emulated runtime).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend_ops_fixture.h"
#include "common/backend_data.h"
#include "compute/backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"

namespace shardlm {
namespace {

using test::down;
using test::randn;
using test::up;

constexpr float kEps = 1e-6f;

struct Shape {
  int64_t T, q_heads, kv_heads, head_dim;
};

std::string describe(const Shape& s, bool norms, DType cache) {
  return "T " + std::to_string(s.T) + ", heads " + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads) +
         " x " + std::to_string(s.head_dim) + (norms ? ", q/k norms" : "") + ", cache " + dtype_name(cache);
}

size_t elem_bytes(DType d) { return d == DType::F32 ? 4 : d == DType::BF16 ? 2 : 1; }

// A step's token positions (up to ~32k, spread by `stride`) and cache slots: every third token a
// padding slot (-1), the rest scattered over `slots_total` slots. Uploaded to b.
struct StepSlots {
  int32_t* pos;
  int64_t* slots;
};
StepSlots step_slots(ComputeBackend& b, int64_t T, int64_t slots_total, int64_t stride, uint32_t seed) {
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<int64_t> slots(pos.size());
  for (int64_t t = 0; t < T; ++t) {
    pos[t] = static_cast<int32_t>((t * stride + seed) % 32768);
    slots[t] = t % 3 == 2 ? -1 : (t * 5 + 1) % slots_total;
  }
  return {up(b, pos), up(b, slots)};
}

// The nodes of a graph captured around step() (which the capture records, not runs).
int64_t captured_nodes_of(ComputeBackend& b, const std::function<void()>& step) {
  b.begin_capture();
  step();
  const int64_t n = b.captured_nodes(b.end_capture());
  b.drop_captures();
  return n;
}

class CudaRopeKvWrite : public CudaBackendOps {
 protected:
  // One layer's step on a backend: its inputs in that backend's memory.
  struct Step {
    ComputeBackend* b = nullptr;
    Shape s{};
    float *q = nullptr, *k = nullptr, *v = nullptr, *inv_freq = nullptr;
    int32_t* pos = nullptr;
    int64_t* slots = nullptr;
    Vector q_norm, k_norm;
    KvCacheRef cache;
    int64_t slots_total = 0;

    int64_t q_n() const { return s.T * s.q_heads * s.head_dim; }
    int64_t kv_n() const { return s.T * s.kv_heads * s.head_dim; }
    size_t side_bytes() const {
      return static_cast<size_t>(slots_total * s.kv_heads * s.head_dim) * elem_bytes(cache.dtype);
    }
    ComputeBackend::QkNorms norms(bool on) const {
      return on ? ComputeBackend::QkNorms{&q_norm, &k_norm, kEps} : ComputeBackend::QkNorms{};
    }
    void release() {
      for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(inv_freq),
                      static_cast<void*>(pos), static_cast<void*>(slots), cache.k, cache.v})
        b->free(p);
    }
  };

  // Random q/k/v, norm weights about 1, positions up to ~32k, every third token a padding slot
  // (-1), the rest scattered over a cache of 2T + 3 slots that starts out holding 0x5a bytes.
  Step make(ComputeBackend& b, const Shape& s, DType cache_dtype, uint32_t seed) {
    Step st;
    st.b = &b;
    st.s = s;
    st.q = up(b, randn(static_cast<size_t>(s.T * s.q_heads * s.head_dim), seed, 2.0f));
    st.k = up(b, randn(static_cast<size_t>(s.T * s.kv_heads * s.head_dim), seed + 1, 2.0f));
    st.v = up(b, randn(static_cast<size_t>(s.T * s.kv_heads * s.head_dim), seed + 2));
    std::vector<float> inv(static_cast<size_t>(s.head_dim / 2));
    for (size_t i = 0; i < inv.size(); ++i)
      inv[i] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(s.head_dim));
    st.inv_freq = up(b, inv);
    st.slots_total = 2 * s.T + 3;
    const StepSlots at = step_slots(b, s.T, st.slots_total, 7919, seed);
    st.pos = at.pos;
    st.slots = at.slots;
    for (auto [w, sd] : {std::pair{&st.q_norm, seed + 3}, std::pair{&st.k_norm, seed + 4}}) {
      auto g = randn(static_cast<size_t>(s.head_dim), sd, 0.3f);
      for (float& x : g) x += 1.0f;
      *w = b.load_vector(test::tensor_view("norm", DType::F32, {s.head_dim}, g.data(), g.size() * 4));
    }
    st.cache.dtype = cache_dtype;
    st.cache.k_scale = 0.05f;
    st.cache.v_scale = 0.02f;
    const std::vector<uint8_t> fill(st.side_bytes(), 0x5a);
    st.cache.k = up(b, fill);
    st.cache.v = up(b, fill);
    return st;
  }

  void fused(Step& st, bool norms) {
    gpu_->rope_kv_write(st.q, st.s.q_heads, st.k, st.v, st.s.kv_heads, st.s.T, st.s.head_dim, st.norms(norms), st.pos,
                        st.inv_freq, st.slots, 1, st.cache);
  }
  void separate(Step& st, bool norms) {
    if (norms) {
      gpu_->rmsnorm(st.q, st.q_norm, st.s.T * st.s.q_heads, kEps, st.q);
      gpu_->rmsnorm(st.k, st.k_norm, st.s.T * st.s.kv_heads, kEps, st.k);
    }
    gpu_->rope_qk(st.q, st.s.q_heads, st.k, st.s.kv_heads, st.s.T, st.s.head_dim, st.pos, st.inv_freq);
    gpu_->kv_write(st.k, st.v, st.s.T, st.slots, st.s.kv_heads, st.s.head_dim, 1, st.cache);
  }

  static void expect_same_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, const char* what,
                                const std::string& where) {
    ASSERT_EQ(a.size(), b.size());
    size_t first = a.size();
    for (size_t i = 0; i < a.size() && first == a.size(); ++i)
      if (a[i] != b[i]) first = i;
    EXPECT_EQ(first, a.size()) << what << " differ from byte " << first << ": " << where;
  }
  std::vector<uint8_t> bytes(const void* p, size_t n) { return down(*gpu_, static_cast<const uint8_t*>(p), n); }
};

TEST_F(CudaRopeKvWrite, MatchesTheSeparateLaunchesBitForBit) {
  // Head widths: 8 (stories260K: a pair within a lane's reach of the next), 64 and 128 (Llama,
  // Qwen), 96 (rotate-half pairs 48 apart: across lanes), 320 (past the 256 threads of an rmsnorm
  // block: two elements a thread) and 22 (not a multiple of a warp).
  const Shape shapes[] = {{1, 4, 2, 8}, {5, 8, 2, 64}, {3, 6, 1, 96}, {40, 4, 4, 128}, {2, 3, 1, 320}, {7, 2, 1, 22}};
  uint32_t seed = 10;
  for (const Shape& s : shapes)
    for (bool norms : {false, true})
      for (DType cache : {DType::F32, DType::BF16, DType::F8_E4M3}) {
        const std::string where = describe(s, norms, cache);
        seed += 10;
        Step a = make(*gpu_, s, cache, seed), b = make(*gpu_, s, cache, seed);
        fused(a, norms);
        separate(b, norms);
        expect_same_bytes(bytes(a.q, a.q_n() * 4), bytes(b.q, b.q_n() * 4), "q", where);
        expect_same_bytes(bytes(a.k, a.kv_n() * 4), bytes(b.k, b.kv_n() * 4), "k", where);
        expect_same_bytes(bytes(a.cache.k, a.side_bytes()), bytes(b.cache.k, b.side_bytes()), "k cache", where);
        expect_same_bytes(bytes(a.cache.v, a.side_bytes()), bytes(b.cache.v, b.side_bytes()), "v cache", where);
        // The tokens' slots were written, and every other slot (padding tokens point at none)
        // still holds the fill: blocks of one slot, so a slot's row of each side is contiguous.
        const size_t row = static_cast<size_t>(s.kv_heads * s.head_dim) * elem_bytes(cache);
        std::vector<bool> written(static_cast<size_t>(a.slots_total));
        for (int64_t t = 0; t < s.T; ++t)
          if (t % 3 != 2) written[static_cast<size_t>((t * 5 + 1) % a.slots_total)] = true;  // step_slots' rule
        const std::vector<uint8_t> fill(row, 0x5a);
        for (const void* side : {a.cache.k, a.cache.v}) {
          const auto c = bytes(side, a.side_bytes());
          for (size_t slot = 0; slot < written.size(); ++slot) {
            const bool same = std::memcmp(c.data() + slot * row, fill.data(), row) == 0;
            EXPECT_NE(same, written[slot])
                << "slot " << slot << (written[slot] ? " unwritten: " : " written: ") << where;
          }
        }
        a.release();
        b.release();
      }
}

TEST_F(CudaRopeKvWrite, QueriesAndKeysMatchTheCpu) {
  const Shape s{6, 8, 2, 128};
  for (bool norms : {false, true}) {
    Step g = make(*gpu_, s, DType::F32, 300), c = make(cpu_, s, DType::F32, 300);
    fused(g, norms);
    c.b->rope_kv_write(c.q, s.q_heads, c.k, c.v, s.kv_heads, s.T, s.head_dim, c.norms(norms), c.pos, c.inv_freq,
                       c.slots, 1, c.cache);
    for (auto [gp, cp, n] : {std::tuple{g.q, c.q, g.q_n()}, std::tuple{g.k, c.k, g.kv_n()}}) {
      const auto x = down(*gpu_, gp, static_cast<size_t>(n));
      const auto y = down(cpu_, cp, static_cast<size_t>(n));
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_NEAR(x[i], y[i], 2e-5f * (1.0f + std::fabs(y[i]))) << "element " << i << (norms ? ", q/k norms" : "");
    }
    g.release();
    c.release();
  }
}

TEST_F(CudaRopeKvWrite, CapturedCallIsOneNode) {
  for (bool norms : {false, true}) {
    Step a = make(*gpu_, {1, 8, 2, 128}, DType::BF16, 400);
    const int64_t one = captured_nodes_of(*gpu_, [&] { fused(a, norms); });
    const int64_t apart = captured_nodes_of(*gpu_, [&] { separate(a, norms); });
    EXPECT_EQ(one, 1) << (norms ? "q/k norms" : "");
    EXPECT_EQ(apart, norms ? 4 : 2);
    a.release();
  }
}

TEST_F(CudaRopeKvWrite, HeadWiderThanTheKernelStagesTakesTheSeparateLaunches) {
  const Shape s{2, 1, 1, 1040};
  Step a = make(*gpu_, s, DType::F32, 500), b = make(*gpu_, s, DType::F32, 500);
  EXPECT_EQ(captured_nodes_of(*gpu_, [&] { fused(a, true); }), 4);
  fused(a, true);
  separate(b, true);
  EXPECT_EQ(bytes(a.cache.k, a.side_bytes()), bytes(b.cache.k, b.side_bytes()));
  EXPECT_EQ(bytes(a.q, a.q_n() * 4), bytes(b.q, b.q_n() * 4));
  a.release();
  b.release();
}

// ---- MLA: CudaBackend::latent_rope_cache_write ----

struct LatentShape {
  int64_t T, n_heads, kv_lora, rope_dim, nope;
};

class CudaLatentRopeCacheWrite : public CudaBackendOps {
 protected:
  struct Step {
    LatentShape s{};
    float *latent = nullptr, *k_rope = nullptr, *q = nullptr, *q_rope = nullptr, *inv_freq = nullptr;
    int32_t* pos = nullptr;
    int64_t* slots = nullptr;
    Vector norm;
    KvCacheRef cache;
    int64_t slots_total = 0;
    int64_t qk() const { return s.nope + s.rope_dim; }
    size_t cache_bytes() const {
      return static_cast<size_t>(slots_total * (s.kv_lora + s.rope_dim)) * elem_bytes(cache.dtype);
    }
    void release(ComputeBackend& b) {
      for (void* p :
           {static_cast<void*>(latent), static_cast<void*>(k_rope), static_cast<void*>(q), static_cast<void*>(q_rope),
            static_cast<void*>(inv_freq), static_cast<void*>(pos), static_cast<void*>(slots), cache.k})
        b.free(p);
    }
  };

  // As CudaRopeKvWrite::make: positions up to ~32k, every third token a padding slot, a cache
  // that starts out holding 0x5a bytes; q_rope starts as NaN.
  Step make(const LatentShape& s, DType cache_dtype, uint32_t seed) {
    Step st;
    st.s = s;
    st.latent = up(*gpu_, randn(static_cast<size_t>(s.T * s.kv_lora), seed, 3.0f));
    st.k_rope = up(*gpu_, randn(static_cast<size_t>(s.T * s.rope_dim), seed + 1));
    st.q = up(*gpu_, randn(static_cast<size_t>(s.T * s.n_heads * st.qk()), seed + 2));
    st.q_rope = up(*gpu_, std::vector<float>(static_cast<size_t>(s.T * s.n_heads * s.rope_dim), NAN));
    std::vector<float> inv(static_cast<size_t>(s.rope_dim / 2));
    for (size_t i = 0; i < inv.size(); ++i)
      inv[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(s.rope_dim)) / 40.0f;
    st.inv_freq = up(*gpu_, inv);
    st.slots_total = 2 * s.T + 3;
    const StepSlots at = step_slots(*gpu_, s.T, st.slots_total, 6007, seed);
    st.pos = at.pos;
    st.slots = at.slots;
    auto g = randn(static_cast<size_t>(s.kv_lora), seed + 3, 0.3f);
    for (float& x : g) x += 1.0f;
    st.norm = gpu_->load_vector(test::tensor_view("kv_a_norm", DType::F32, {s.kv_lora}, g.data(), g.size() * 4));
    st.cache.dtype = cache_dtype;
    st.cache.k_scale = st.cache.v_scale = 0.03f;
    st.cache.k = up(*gpu_, std::vector<uint8_t>(st.cache_bytes(), 0x5a));
    return st;
  }

  static ComputeBackend::LatentRopeArgs args(const Step& st, bool interleaved, float factor) {
    return {st.pos, st.inv_freq, interleaved, factor};
  }
  void fused(Step& st, bool interleaved, float factor) {
    const LatentShape& s = st.s;
    gpu_->latent_rope_cache_write(st.latent, st.norm, kEps, st.k_rope, st.q + s.nope, s.n_heads, s.n_heads * st.qk(),
                                  st.qk(), st.q_rope, s.T, s.kv_lora, s.rope_dim, args(st, interleaved, factor),
                                  st.slots, st.cache);
  }
  void separate(Step& st, bool interleaved, float factor) {
    const LatentShape& s = st.s;
    gpu_->rmsnorm(st.latent, st.norm, s.T, kEps, st.latent);
    gpu_->rope_strided(st.k_rope, s.T, 1, s.rope_dim, s.rope_dim, s.rope_dim, st.pos, st.inv_freq, interleaved, factor,
                       st.k_rope);
    gpu_->rope_strided(st.q + s.nope, s.T, s.n_heads, s.n_heads * st.qk(), st.qk(), s.rope_dim, st.pos, st.inv_freq,
                       interleaved, factor, st.q_rope);
    gpu_->latent_cache_write(st.latent, st.k_rope, s.T, st.slots, s.kv_lora, s.rope_dim, st.cache);
  }
  std::vector<uint8_t> bytes(const void* p, size_t n) { return down(*gpu_, static_cast<const uint8_t*>(p), n); }
};

TEST_F(CudaLatentRopeCacheWrite, MatchesTheSeparateLaunchesBitForBit) {
  // DeepSeek-V3's 512 + 64 (a tp shard's 16 heads, decode and prefill), a latent of 520 (three
  // elements for some threads of the 256-thread norm), small and odd sizes.
  const LatentShape shapes[] = {{1, 16, 512, 64, 128}, {40, 4, 512, 64, 128}, {5, 3, 520, 32, 16}, {7, 9, 96, 8, 5}};
  uint32_t seed = 700;
  for (const LatentShape& s : shapes)
    for (bool interleaved : {false, true})
      for (float factor : {1.0f, 1.3678f})
        for (DType cache : {DType::F32, DType::BF16, DType::F8_E4M3}) {
          const std::string where = "T " + std::to_string(s.T) + ", " + std::to_string(s.n_heads) + " heads, " +
                                    std::to_string(s.kv_lora) + " + " + std::to_string(s.rope_dim) +
                                    (interleaved ? ", interleaved" : "") + ", factor " + std::to_string(factor) +
                                    ", cache " + dtype_name(cache);
          seed += 10;
          Step a = make(s, cache, seed), b = make(s, cache, seed);
          fused(a, interleaved, factor);
          separate(b, interleaved, factor);
          const size_t lat = static_cast<size_t>(s.T * s.kv_lora) * 4, kr = static_cast<size_t>(s.T * s.rope_dim) * 4;
          const size_t qr = static_cast<size_t>(s.T * s.n_heads * s.rope_dim) * 4;
          EXPECT_EQ(bytes(a.latent, lat), bytes(b.latent, lat)) << "latent: " << where;
          EXPECT_EQ(bytes(a.k_rope, kr), bytes(b.k_rope, kr)) << "rope key: " << where;
          EXPECT_EQ(bytes(a.q_rope, qr), bytes(b.q_rope, qr)) << "q_rope: " << where;
          const auto ca = bytes(a.cache.k, a.cache_bytes());
          EXPECT_EQ(ca, bytes(b.cache.k, b.cache_bytes())) << "cache: " << where;
          EXPECT_NE(ca, std::vector<uint8_t>(ca.size(), 0x5a)) << where;
          a.release(*gpu_);
          b.release(*gpu_);
        }
}

TEST_F(CudaLatentRopeCacheWrite, CapturedCallIsOneNode) {
  Step a = make({1, 16, 512, 64, 128}, DType::BF16, 900);
  EXPECT_EQ(captured_nodes_of(*gpu_, [&] { fused(a, true, 1.0f); }), 1);
  EXPECT_EQ(captured_nodes_of(*gpu_, [&] { separate(a, true, 1.0f); }), 4);
  a.release(*gpu_);
}

TEST_F(CudaLatentRopeCacheWrite, RopeWiderThanTheKernelStagesTakesTheSeparateLaunches) {
  const LatentShape s{3, 2, 64, 260, 4};
  Step a = make(s, DType::F32, 950), b = make(s, DType::F32, 950);
  fused(a, false, 1.0f);
  separate(b, false, 1.0f);
  EXPECT_EQ(bytes(a.cache.k, a.cache_bytes()), bytes(b.cache.k, b.cache_bytes()));
  const size_t qr = static_cast<size_t>(s.T * s.n_heads * s.rope_dim) * 4;
  EXPECT_EQ(bytes(a.q_rope, qr), bytes(b.q_rope, qr));
  a.release(*gpu_);
  b.release(*gpu_);
}

}  // namespace
}  // namespace shardlm
