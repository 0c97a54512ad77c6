// What the narrow KV cache tests (bf16, fp8) share: random rows, a thread-count guard, a batch of
// three sequences with scrambled, interleaved physical blocks whose tokens go in one call (a chunk
// of A, B's decode token, the start of C, and a padding token), and the check that attention over
// a narrow cache is, bit for bit, attention over an fp32 cache of the values it reads back.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "cpu/latent_attention.h"
#include "cpu/paged_attention.h"
#include "cpu/threads.h"
#include "kv_cache_format.h"

namespace shardlm::test {

struct ThreadGuard {
  int saved = cpu::num_threads();
  ~ThreadGuard() { cpu::set_num_threads(saved); }
};

inline std::vector<float> rand_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-scale, scale);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

struct Batch {
  std::vector<int32_t> tA{9, 2, 7, 4, 0, 11}, tB{5, 1, 10}, tC{3};
  int64_t lenA = 81, lenB = 45, lenC = 12;
  std::vector<int32_t> pos;
  std::vector<const int32_t*> bt;
  Batch() {
    for (int32_t p = 60; p < lenA; ++p) pos.push_back(p), bt.push_back(tA.data());
    pos.push_back(static_cast<int32_t>(lenB - 1)), bt.push_back(tB.data());
    for (int32_t p = 0; p < lenC; ++p) pos.push_back(p), bt.push_back(tC.data());
    pos.push_back(-1), bt.push_back(tC.data());
  }
  int64_t T() const { return static_cast<int64_t>(pos.size()); }
  static std::vector<int64_t> slots(const std::vector<int32_t>& table, int64_t len, int64_t bs) {
    std::vector<int64_t> s(static_cast<size_t>(len));
    for (int64_t p = 0; p < len; ++p) s[p] = table[p / bs] * bs + p % bs;
    return s;
  }
};

// The values a cache side of elem with this scale reads back for v.
inline std::vector<float> read_back(const std::vector<float>& v, KvElem elem, float scale) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    float f = 0;  // a slot of the element's own type
    uint16_t h = 0;
    uint8_t c = 0;
    void* slot = elem == KvElem::BF16 ? static_cast<void*>(&h) : elem == KvElem::FP8 ? static_cast<void*>(&c) : &f;
    kv_store(slot, 0, v[i], elem, scale);
    r[i] = kv_load(slot, 0, elem, scale);
  }
  return r;
}

// paged_attention over a cache of E in format fmt against the fp32 cache of its values read back,
// for each (head_dim, query heads, KV heads), windows 0 and 29, on 1 and 2 threads. Unwritten
// slots hold `unwritten` (a NaN), so a stray read shows.
template <class E>
void expect_paged_attention_reads_back(const KvFormat& fmt, E unwritten,
                                       std::initializer_list<std::tuple<int64_t, int64_t, int64_t>> shapes) {
  ThreadGuard guard;
  const int64_t bs = 16;
  Batch b;
  for (auto [hd, n_heads, n_kv] : shapes) {
    const int64_t nblocks = 12, row = n_kv * hd, T = b.T();
    std::vector<E> kn(nblocks * bs * row, unwritten), vn(kn.size(), unwritten);
    std::vector<float> kf(kn.size(), NAN), vf(kn.size(), NAN);
    uint32_t seed = 10;
    for (auto [table, len] : {std::pair{&b.tA, b.lenA}, {&b.tB, b.lenB}, {&b.tC, b.lenC}}) {
      const auto k = rand_vec(len * row, seed++, 3.0f), v = rand_vec(len * row, seed++);
      const auto slots = Batch::slots(*table, len, bs);
      cpu::kv_cache_write(k.data(), v.data(), len, slots.data(), n_kv, hd, bs, kn.data(), vn.data(), fmt);
      const auto kr = read_back(k, fmt.elem, fmt.k_scale), vr = read_back(v, fmt.elem, fmt.v_scale);
      cpu::kv_cache_write(kr.data(), vr.data(), len, slots.data(), n_kv, hd, bs, kf.data(), vf.data(), KvElem::F32);
    }
    const auto q = rand_vec(T * n_heads * hd, 40);
    for (int64_t window : {0, 29}) {
      for (int threads : {1, 2}) {
        cpu::set_num_threads(threads);
        std::vector<float> want(T * n_heads * hd, NAN), got(want.size(), -1.0f);
        cpu::paged_attention(q.data(), T, n_heads, n_kv, hd, kf.data(), vf.data(), KvElem::F32, bs, b.bt.data(),
                             b.pos.data(), window, 0.2f, want.data());
        cpu::paged_attention(q.data(), T, n_heads, n_kv, hd, kn.data(), vn.data(), fmt, bs, b.bt.data(), b.pos.data(),
                             window, 0.2f, got.data());
        for (float x : want) ASSERT_TRUE(std::isfinite(x));
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "head_dim " << hd << ", " << n_heads << "/" << n_kv << " heads, scales " << fmt.k_scale << "/"
            << fmt.v_scale << ", window " << window << ", " << threads << " threads";
      }
    }
  }
}

// latent_attention likewise, for each (kv_lora, rope_dim, heads); the whole latent row takes the K
// side's scale.
template <class E>
void expect_latent_attention_reads_back(const KvFormat& fmt, E unwritten,
                                        std::initializer_list<std::tuple<int64_t, int64_t, int64_t>> shapes) {
  ThreadGuard guard;
  const int64_t bs = 16;
  Batch b;
  for (auto [L, dr, nh] : shapes) {
    const int64_t nblocks = 12, row = L + dr, T = b.T();
    std::vector<E> cn(nblocks * bs * row, unwritten);
    std::vector<float> cf(cn.size(), NAN);
    uint32_t seed = 50;
    for (auto [table, len] : {std::pair{&b.tA, b.lenA}, {&b.tB, b.lenB}, {&b.tC, b.lenC}}) {
      const auto lat = rand_vec(len * L, seed++), rope = rand_vec(len * dr, seed++, 2.0f);
      const auto slots = Batch::slots(*table, len, bs);
      cpu::latent_cache_write(lat.data(), rope.data(), len, slots.data(), L, dr, cn.data(), fmt);
      const auto lr = read_back(lat, fmt.elem, fmt.k_scale), rr = read_back(rope, fmt.elem, fmt.k_scale);
      cpu::latent_cache_write(lr.data(), rr.data(), len, slots.data(), L, dr, cf.data(), KvElem::F32);
    }
    const auto ql = rand_vec(T * nh * L, 60), qr = rand_vec(T * nh * dr, 61);
    for (int threads : {1, 2}) {
      cpu::set_num_threads(threads);
      std::vector<float> want(T * nh * L, NAN), got(want.size(), -1.0f);
      cpu::latent_attention(ql.data(), qr.data(), T, nh, L, dr, cf.data(), KvElem::F32, bs, b.bt.data(), b.pos.data(),
                            0.05f, want.data());
      cpu::latent_attention(ql.data(), qr.data(), T, nh, L, dr, cn.data(), fmt, bs, b.bt.data(), b.pos.data(), 0.05f,
                            got.data());
      for (float x : want) ASSERT_TRUE(std::isfinite(x));
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << "kv_lora " << L << ", rope " << dr << ", " << nh << " heads, scale " << fmt.k_scale << ", " << threads
          << " threads";
    }
  }
}

}  // namespace shardlm::test
