// kv_cache_write + paged_attention against a double-precision reference on a contiguous cache.
// Tolerance: |out - ref| <= 1e-5 * max_j |v_j| (softmax weights sum to 1; fp32 dot products over
// head_dim <= 128 and fp32 exp/sum give relative errors ~1e-6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/paged_attention.h"
#include "cpu/reduce_util.h"
#include "cpu/threads.h"

using namespace shardlm;

namespace {

std::vector<float> rand_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

// A sequence's contiguous K/V: [len, n_kv, hd].
struct Seq {
  int64_t len;
  std::vector<float> k, v;
};

// Reference: token at position p of seq attends to [max(0, p-window+1), p].
void ref_attention(const float* q, const Seq& s, int64_t p, int64_t n_heads, int64_t n_kv, int64_t hd, int64_t window,
                   float scale, std::vector<double>& out) {
  out.assign(n_heads * hd, 0.0);
  const int64_t p0 = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t kvh = h / (n_heads / n_kv);
    std::vector<double> sc;
    double mx = -1e300;
    for (int64_t j = p0; j <= p; ++j) {
      double d = 0;
      for (int64_t i = 0; i < hd; ++i) d += static_cast<double>(q[h * hd + i]) * s.k[(j * n_kv + kvh) * hd + i];
      sc.push_back(d * scale);
      mx = std::max(mx, sc.back());
    }
    double sum = 0;
    for (auto& e : sc) sum += (e = std::exp(e - mx));
    for (int64_t j = p0; j <= p; ++j)
      for (int64_t i = 0; i < hd; ++i) out[h * hd + i] += sc[j - p0] / sum * s.v[(j * n_kv + kvh) * hd + i];
  }
}

struct Cache {
  int64_t block_size, n_kv, hd, num_blocks;
  std::vector<float> k, v;
  Cache(int64_t bs, int64_t nkv, int64_t hd_, int64_t nb)
      : block_size(bs), n_kv(nkv), hd(hd_), num_blocks(nb), k(nb * bs * nkv * hd_, NAN), v(nb * bs * nkv * hd_, NAN) {}
};

// Writes seq into the cache through kv_cache_write following its block table.
void fill(Cache& c, const Seq& s, const std::vector<int32_t>& table) {
  std::vector<int64_t> slots(s.len);
  for (int64_t p = 0; p < s.len; ++p) slots[p] = table[p / c.block_size] * c.block_size + p % c.block_size;
  cpu::kv_cache_write(s.k.data(), s.v.data(), s.len, slots.data(), c.n_kv, c.hd, c.block_size, c.k.data(), c.v.data(),
                      cpu::CacheElem::F32);
}

Seq make_seq(int64_t len, int64_t n_kv, int64_t hd, uint32_t seed) {
  return Seq{len, rand_vec(len * n_kv * hd, seed), rand_vec(len * n_kv * hd, seed + 1000)};
}

struct AttnSetup {
  int64_t n_heads = 8, n_kv = 2, hd = 64, bs = 16;
  float scale = 0.125f;
};

// Runs every position of seq as one batch through paged attention (block table `table`).
std::vector<float> run_all(const AttnSetup& st, const Cache& c, const std::vector<float>& q, int64_t len,
                           const std::vector<int32_t>& table, int64_t window) {
  std::vector<int32_t> pos(len);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<const int32_t*> bt(len, table.data());
  std::vector<float> out(len * st.n_heads * st.hd);
  cpu::paged_attention(q.data(), len, st.n_heads, st.n_kv, st.hd, c.k.data(), c.v.data(), cpu::CacheElem::F32,
                       c.block_size, bt.data(), pos.data(), window, st.scale, out.data());
  return out;
}

TEST(PagedAttention, MatchesReferenceGqaAndWindow) {
  AttnSetup st;
  const int64_t len = 70;
  Seq s = make_seq(len, st.n_kv, st.hd, 1);
  Cache c(st.bs, st.n_kv, st.hd, 8);
  std::vector<int32_t> table = {0, 1, 2, 3, 4};
  fill(c, s, table);
  auto q = rand_vec(len * st.n_heads * st.hd, 2);
  for (int64_t window : {0, 1, 5, 16, 33}) {
    auto out = run_all(st, c, q, len, table, window);
    std::vector<double> ref;
    for (int64_t p = 0; p < len; ++p) {
      ref_attention(&q[p * st.n_heads * st.hd], s, p, st.n_heads, st.n_kv, st.hd, window, st.scale, ref);
      for (int64_t i = 0; i < st.n_heads * st.hd; ++i)
        ASSERT_NEAR(out[p * st.n_heads * st.hd + i], ref[i], 1e-5) << "window=" << window << " p=" << p;
    }
  }
}

TEST(PagedAttention, GqaHeadMapping) {
  // Make kv head 1 differ from kv head 0 only in V; heads 0..3 must equal head 0's result and
  // heads 4..7 head 4's (n_heads 8, n_kv 2: head h uses kv head h / 4).
  AttnSetup st;
  const int64_t len = 20;
  Seq s = make_seq(len, st.n_kv, st.hd, 3);
  for (int64_t p = 0; p < len; ++p)
    for (int64_t i = 0; i < st.hd; ++i) {
      s.k[(p * 2 + 1) * st.hd + i] = s.k[(p * 2 + 0) * st.hd + i];
      s.v[(p * 2 + 1) * st.hd + i] = s.v[(p * 2 + 0) * st.hd + i] + 10.0f;
    }
  Cache c(st.bs, st.n_kv, st.hd, 2);
  std::vector<int32_t> table = {1, 0};
  fill(c, s, table);
  auto one = rand_vec(st.hd, 4);
  std::vector<float> q(len * st.n_heads * st.hd);
  for (int64_t t = 0; t < len; ++t)
    for (int64_t h = 0; h < st.n_heads; ++h) std::copy(one.begin(), one.end(), &q[(t * st.n_heads + h) * st.hd]);
  auto out = run_all(st, c, q, len, table, 0);
  for (int64_t t = 0; t < len; ++t)
    for (int64_t h = 0; h < st.n_heads; ++h)
      for (int64_t i = 0; i < st.hd; ++i) {
        const float got = out[(t * st.n_heads + h) * st.hd + i];
        const float base = out[(t * st.n_heads + (h < 4 ? 0 : 4)) * st.hd + i];
        ASSERT_EQ(got, base);
        if (h >= 4) {
          ASSERT_NEAR(got, out[(t * st.n_heads) * st.hd + i] + 10.0f, 1e-4);
        }
      }
}

TEST(PagedAttention, ScrambledBlockTableEqualsContiguous) {
  AttnSetup st;
  const int64_t len = 100;  // 7 blocks of 16
  Seq s = make_seq(len, st.n_kv, st.hd, 5);
  auto q = rand_vec(len * st.n_heads * st.hd, 6);
  Cache c1(st.bs, st.n_kv, st.hd, 7), c2(st.bs, st.n_kv, st.hd, 20);
  std::vector<int32_t> contiguous = {0, 1, 2, 3, 4, 5, 6}, scrambled = {13, 2, 19, 7, 0, 11, 5};
  fill(c1, s, contiguous);
  fill(c2, s, scrambled);
  for (int64_t window : {0, 24}) {
    auto a = run_all(st, c1, q, len, contiguous, window);
    auto b = run_all(st, c2, q, len, scrambled, window);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "window=" << window;
  }
}

TEST(PagedAttention, BatchInvariantAcrossTokensAndSequences) {
  // Two sequences in one cache; a mixed batch (prefill chunk of A + decode token of B) must give
  // the same bits per token as each token alone, with 1 and 2 threads.
  AttnSetup st;
  const int64_t lenA = 40, lenB = 29;
  Seq A = make_seq(lenA, st.n_kv, st.hd, 7), B = make_seq(lenB, st.n_kv, st.hd, 8);
  Cache c(st.bs, st.n_kv, st.hd, 10);
  std::vector<int32_t> tA = {3, 8, 1}, tB = {6, 0};
  fill(c, A, tA);
  fill(c, B, tB);
  const int64_t row = st.n_heads * st.hd;
  // Batch: A positions 30..39 then B position 28.
  const int64_t T = 11;
  auto q = rand_vec(T * row, 9);
  std::vector<int32_t> pos(T);
  std::vector<const int32_t*> bt(T);
  for (int64_t t = 0; t < 10; ++t) pos[t] = 30 + t, bt[t] = tA.data();
  pos[10] = 28, bt[10] = tB.data();
  const int saved = cpu::num_threads();
  for (int64_t window : {0, 8}) {
    std::vector<float> batch(T * row);
    cpu::set_num_threads(2);
    cpu::paged_attention(q.data(), T, st.n_heads, st.n_kv, st.hd, c.k.data(), c.v.data(), cpu::CacheElem::F32, st.bs,
                         bt.data(), pos.data(), window, st.scale, batch.data());
    cpu::set_num_threads(1);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> alone(row);
      cpu::paged_attention(&q[t * row], 1, st.n_heads, st.n_kv, st.hd, c.k.data(), c.v.data(), cpu::CacheElem::F32,
                           st.bs, &bt[t], &pos[t], window, st.scale, alone.data());
      ASSERT_EQ(0, std::memcmp(alone.data(), &batch[t * row], row * 4)) << "t=" << t << " window=" << window;
    }
    // And against the reference.
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t) {
      ref_attention(&q[t * row], t < 10 ? A : B, pos[t], st.n_heads, st.n_kv, st.hd, window, st.scale, ref);
      for (int64_t i = 0; i < row; ++i) ASSERT_NEAR(batch[t * row + i], ref[i], 1e-5);
    }
  }
  cpu::set_num_threads(saved);
}

TEST(PagedAttention, HeadRunsGiveTheSameBits) {
  // A lone token with 8 query heads on one KV head: with t threads the heads are walked in runs of
  // ceil(8 / t) sharing each row read (8, 4, 3 + 3 + 2, 1), and every split gives the same bits.
  AttnSetup st;
  st.n_heads = 8;
  st.n_kv = 1;
  const int64_t len = 300;
  Seq A = make_seq(len, st.n_kv, st.hd, 21);
  Cache c(st.bs, st.n_kv, st.hd, 20);
  std::vector<int32_t> table(19);
  std::iota(table.rbegin(), table.rend(), 0);  // blocks in reverse order
  fill(c, A, table);
  const int64_t row = st.n_heads * st.hd;
  const auto q = rand_vec(row, 22);
  const int32_t p = static_cast<int32_t>(len - 1);
  const int32_t* bt = table.data();
  const int saved = cpu::num_threads();
  for (int64_t window : {0, 50}) {
    std::vector<float> first;
    for (int threads : {1, 2, 3, 8}) {
      cpu::set_num_threads(threads);
      std::vector<float> out(row, NAN);
      cpu::paged_attention(q.data(), 1, st.n_heads, st.n_kv, st.hd, c.k.data(), c.v.data(), cpu::CacheElem::F32, st.bs,
                           &bt, &p, window, st.scale, out.data());
      if (first.empty()) {
        first = out;
        std::vector<double> ref;
        ref_attention(q.data(), A, p, st.n_heads, st.n_kv, st.hd, window, st.scale, ref);
        for (int64_t i = 0; i < row; ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << "window " << window;
      }
      ASSERT_EQ(0, std::memcmp(first.data(), out.data(), row * 4)) << threads << " threads, window " << window;
    }
  }
  cpu::set_num_threads(saved);
}

// The kernel's definition in plain loops: per (token, head), scores dot16(q, k_j) * scale in
// position order, softmax_in_place, then out += p_j v_j in position order (product rounded, then
// added). The kernel shares row reads across tokens of a sequence and heads of a KV head, and
// runs the loops in vector form; none of that may change a bit.
std::vector<float> plain_attention(const std::vector<float>& q, const std::vector<int32_t>& pos,
                                   const std::vector<const int32_t*>& bt, const Cache& c, int64_t n_heads,
                                   int64_t window, float scale) {
  const int64_t hd = c.hd, n_kv = c.n_kv;
  std::vector<float> out(pos.size() * n_heads * hd, 0.0f);
  for (size_t t = 0; t < pos.size(); ++t) {
    const int64_t p1 = pos[t], p0 = window > 0 ? std::max<int64_t>(0, p1 - window + 1) : 0;
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / (n_heads / n_kv);
      std::vector<float> sc;
      std::vector<const float*> vr;
      for (int64_t p = p0; p <= p1; ++p) {
        // The cache is [block][KV head][offset][dim].
        const int64_t at = ((bt[t][p / c.block_size] * n_kv + kvh) * c.block_size + p % c.block_size) * hd;
        sc.push_back(cpu::detail::dot16(&q[(t * n_heads + h) * hd], &c.k[at], hd) * scale);
        vr.push_back(&c.v[at]);
      }
      cpu::detail::softmax_in_place(sc.data(), static_cast<int64_t>(sc.size()));
      float* o = &out[(t * n_heads + h) * hd];
      for (size_t j = 0; j < sc.size(); ++j) {
        for (int64_t d = 0; d < hd; ++d) {
          const float prod = sc[j] * vr[j][d];
          o[d] = o[d] + prod;
        }
      }
    }
  }
  return out;
}

TEST(PagedAttention, GivesThePlainLoopsBits) {
  // One step: a 21-token prefill chunk of A (tiles of 8 + 8 + 5 tokens), a decode token of B, a
  // 12-token first chunk of C and a padding token (pos -1, zeros), over head sizes with and
  // without a tail past the 16-float vectors, MHA and GQA, with and without a sliding window;
  // blocks of 16 positions (a power of two: the kernels locate rows by shifts) and of 24 (by
  // division).
  const int saved = cpu::num_threads();
  for (auto [hd, bs] : {std::pair<int64_t, int64_t>{8, 16}, {16, 24}, {80, 16}, {128, 24}, {128, 16}}) {
    for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}}) {
      Seq A = make_seq(81, n_kv, hd, 31), B = make_seq(45, n_kv, hd, 32), C = make_seq(12, n_kv, hd, 33);
      Cache c(bs, n_kv, hd, 12);
      std::vector<int32_t> tA = {9, 2, 7, 4, 0, 11}, tB = {5, 1, 10}, tC = {3};
      fill(c, A, tA);
      fill(c, B, tB);
      fill(c, C, tC);
      std::vector<int32_t> pos;
      std::vector<const int32_t*> bt;
      for (int32_t p = 60; p <= 80; ++p) pos.push_back(p), bt.push_back(tA.data());
      pos.push_back(44), bt.push_back(tB.data());
      for (int32_t p = 0; p < 12; ++p) pos.push_back(p), bt.push_back(tC.data());
      pos.push_back(-1), bt.push_back(tC.data());
      const int64_t T = static_cast<int64_t>(pos.size());
      const auto q = rand_vec(T * n_heads * hd, 34);
      for (int64_t window : {0, 37}) {
        const std::vector<float> want = plain_attention(q, pos, bt, c, n_heads, window, 0.3f);
        for (int threads : {1, 2}) {
          cpu::set_num_threads(threads);
          std::vector<float> out(want.size(), NAN);
          cpu::paged_attention(q.data(), T, n_heads, n_kv, hd, c.k.data(), c.v.data(), cpu::CacheElem::F32, bs,
                               bt.data(), pos.data(), window, 0.3f, out.data());
          ASSERT_EQ(0, std::memcmp(want.data(), out.data(), out.size() * 4))
              << "hd " << hd << ", block " << bs << ", " << n_heads << "/" << n_kv << " heads, window " << window
              << ", " << threads << " threads";
        }
      }
    }
  }
  cpu::set_num_threads(saved);
}

TEST(KvCacheWrite, WritesEachKvHeadsRowsOfABlockTogetherAndSkipsNegative) {
  // Blocks of 4 slots, 2 KV heads of 3 dims: slot s of KV head h is at ((s / 4 * 2 + h) * 4 + s % 4) * 3.
  const int64_t n_kv = 2, hd = 3, T = 4, bs = 4, slots_total = 12;
  auto k = rand_vec(T * n_kv * hd, 10), v = rand_vec(T * n_kv * hd, 11);
  std::vector<float> kc(slots_total * n_kv * hd, 0.0f), vc(kc.size(), 0.0f);
  const std::vector<int64_t> slots = {5, -1, 2, 11};
  cpu::kv_cache_write(k.data(), v.data(), T, slots.data(), n_kv, hd, bs, kc.data(), vc.data(), cpu::CacheElem::F32);
  std::vector<bool> written(kc.size(), false);
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < n_kv; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        const int64_t at = ((slots[t] / bs * n_kv + h) * bs + slots[t] % bs) * hd + d;
        EXPECT_EQ(kc[at], k[(t * n_kv + h) * hd + d]) << "slot " << slots[t] << " head " << h;
        EXPECT_EQ(vc[at], v[(t * n_kv + h) * hd + d]) << "slot " << slots[t] << " head " << h;
        written[at] = true;
      }
  }
  EXPECT_EQ(kc[((1 * n_kv + 1) * bs + 1) * hd], k[(0 * n_kv + 1) * hd]) << "slot 5, KV head 1, by hand";
  for (size_t i = 0; i < kc.size(); ++i) {
    if (!written[i]) {
      EXPECT_TRUE(kc[i] == 0.0f && vc[i] == 0.0f) << "float " << i << " was not to be written";
    }
  }
}

}  // namespace
