// CudaBackend::rope_kv_write: a GQA layer's q/k norms (Qwen3), rope and KV cache write in one
// launch. Its q, k and cache bytes are memcmp-equal to the separate launches' (rmsnorm, rope_qk,
// kv_write), across head widths (one element a lane to several per rmsnorm thread), cache types,
// padding slots and positions; q and k are checked against the CPU backend too, and a captured
// call is one graph node. Skips without a GPU (and runs on the emulated runtime).
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
    std::vector<int32_t> pos(static_cast<size_t>(s.T));
    std::vector<int64_t> slots(pos.size());
    st.slots_total = 2 * s.T + 3;
    for (int64_t t = 0; t < s.T; ++t) {
      pos[t] = static_cast<int32_t>((t * 7919 + seed) % 32768);
      slots[t] = t % 3 == 2 ? -1 : (t * 5 + 1) % st.slots_total;
    }
    st.pos = up(b, pos);
    st.slots = up(b, slots);
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
        // The written slots did change, and a padding token's slot range stayed as filled.
        const auto kc = bytes(a.cache.k, a.side_bytes());
        const size_t row = static_cast<size_t>(s.kv_heads * s.head_dim) * elem_bytes(cache);
        EXPECT_NE(0, std::memcmp(kc.data() + row, std::vector<uint8_t>(row, 0x5a).data(), row)) << where;
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
    auto nodes = [&](const std::function<void()>& step) {
      gpu_->begin_capture();
      step();
      const int64_t n = gpu_->captured_nodes(gpu_->end_capture());
      gpu_->drop_captures();
      return n;
    };
    const int64_t one = nodes([&] { fused(a, norms); });
    const int64_t apart = nodes([&] { separate(a, norms); });
    EXPECT_EQ(one, 1) << (norms ? "q/k norms" : "");
    EXPECT_EQ(apart, norms ? 4 : 2);
    a.release();
  }
}

TEST_F(CudaRopeKvWrite, HeadWiderThanTheKernelStagesTakesTheSeparateLaunches) {
  const Shape s{2, 1, 1, 1040};
  Step a = make(*gpu_, s, DType::F32, 500), b = make(*gpu_, s, DType::F32, 500);
  gpu_->begin_capture();
  fused(a, true);
  const int64_t n = gpu_->captured_nodes(gpu_->end_capture());
  gpu_->drop_captures();
  EXPECT_EQ(n, 4);
  fused(a, true);
  separate(b, true);
  EXPECT_EQ(bytes(a.cache.k, a.side_bytes()), bytes(b.cache.k, b.side_bytes()));
  EXPECT_EQ(bytes(a.q, a.q_n() * 4), bytes(b.q, b.q_n() * 4));
  a.release();
  b.release();
}

}  // namespace
}  // namespace shardlm
