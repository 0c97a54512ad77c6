// The Multi-head Latent Attention kernels against naive double-precision references written here:
// rope_strided (both layouts, strided input, cos/sin multiplier), head_matmul (f32 and bf16
// weights), latent_cache_write + latent_attention (paged, several sequences), and their batch
// invariance (a token's bits do not depend on the other tokens of the call or the thread count);
// latent_attention also against its definition in plain fp32 loops, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "cpu/head_matmul.h"
#include "cpu/latent_attention.h"
#include "cpu/reduce_util.h"
#include "cpu/rope.h"
#include "cpu/rope_strided.h"
#include "cpu/threads.h"

using namespace shardlm;

namespace {

std::vector<float> rand_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// Restores the thread count on scope exit.
struct ThreadGuard {
  int saved = cpu::num_threads();
  ~ThreadGuard() { cpu::set_num_threads(saved); }
};

}  // namespace

// ---------------------------------------------------------------- rope_strided

TEST(RopeStrided, MatchesReferenceBothLayoutsStridedScaled) {
  const int64_t T = 5, nh = 3, dr = 8, half = dr / 2, head_stride = 13, x_stride = nh * head_stride + 2;
  auto x = rand_vec(T * x_stride, 1);
  auto inv = rand_vec(half, 2, 0.001f, 1.0f);
  std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
  const float af = 1.37f;
  for (bool interleaved : {false, true}) {
    std::vector<float> out(T * nh * dr, NAN);
    cpu::rope_strided(x.data(), T, nh, x_stride, head_stride, dr, pos.data(), inv.data(), interleaved, af, out.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const float* v = x.data() + t * x_stride + h * head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const double a = static_cast<double>(static_cast<float>(pos[t]) * inv[i]);
          const double c = std::cos(a) * af, s = std::sin(a) * af;
          const double x1 = interleaved ? v[2 * i] : v[i], x2 = interleaved ? v[2 * i + 1] : v[i + half];
          const float* o = out.data() + (t * nh + h) * dr;
          ASSERT_NEAR(o[i], x1 * c - x2 * s, 2e-6) << "interleaved=" << interleaved << " t=" << t << " i=" << i;
          ASSERT_NEAR(o[i + half], x2 * c + x1 * s, 2e-6) << "interleaved=" << interleaved << " t=" << t;
        }
      }
  }
}

TEST(RopeStrided, PackedInPlaceEqualsOutOfPlaceAndRotateHalf) {
  const int64_t T = 4, nh = 2, dr = 16;
  auto x = rand_vec(T * nh * dr, 3);
  auto inv = rand_vec(dr / 2, 4, 0.001f, 1.0f);
  std::vector<int32_t> pos = {3, 0, 9, 2};
  for (bool interleaved : {false, true}) {
    std::vector<float> out(x.size()), in_place = x;
    cpu::rope_strided(x.data(), T, nh, nh * dr, dr, dr, pos.data(), inv.data(), interleaved, 1.0f, out.data());
    cpu::rope_strided(in_place.data(), T, nh, nh * dr, dr, dr, pos.data(), inv.data(), interleaved, 1.0f,
                      in_place.data());
    ASSERT_EQ(0, std::memcmp(out.data(), in_place.data(), out.size() * 4)) << "interleaved=" << interleaved;
    if (!interleaved) {
      // With factor 1 the rotate-half form is the existing rope kernel, bit for bit.
      std::vector<float> old = x;
      cpu::rope_rotate_half(old.data(), T, nh, dr, pos.data(), inv.data());
      ASSERT_EQ(0, std::memcmp(out.data(), old.data(), out.size() * 4));
    }
  }
}

// ---------------------------------------------------------------- head_matmul

TEST(HeadMatmul, MatchesReferenceF32AndBf16StridedInput) {
  ThreadGuard guard;
  const int64_t T = 7, nh = 5, K = 40, N = 24, head_stride = 50, x_stride = nh * head_stride + 3;
  auto x = rand_vec(T * x_stride, 5);
  auto wf = rand_vec(nh * N * K, 6);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    for (bool bf16 : {false, true}) {
      std::vector<float> y(T * nh * N, NAN);
      if (bf16)
        cpu::head_matmul_bf16w(x.data(), T, nh, x_stride, head_stride, K, wb.data(), N, y.data());
      else
        cpu::head_matmul_f32w(x.data(), T, nh, x_stride, head_stride, K, wf.data(), N, y.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t n = 0; n < N; ++n) {
            double ref = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double w = bf16 ? bf16_to_f32(wb[(h * N + n) * K + k]) : wf[(h * N + n) * K + k];
              ref += x[t * x_stride + h * head_stride + k] * w;
            }
            ASSERT_NEAR(y[(t * nh + h) * N + n], ref, 1e-5) << "bf16=" << bf16 << " t=" << t << " h=" << h;
          }
    }
  }
}

TEST(HeadMatmul, BatchInvariant) {
  // Big enough that both the head-parallel and the per-head threaded paths run.
  ThreadGuard guard;
  for (int64_t T : {3, 64}) {
    const int64_t nh = 4, K = 96, N = 160;
    auto x = rand_vec(T * nh * K, 7);
    auto w = rand_vec(nh * N * K, 8);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
    std::vector<float> batch(T * nh * N);
    cpu::set_num_threads(2);
    cpu::head_matmul_bf16w(x.data(), T, nh, nh * K, K, K, wb.data(), N, batch.data());
    cpu::set_num_threads(1);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> alone(nh * N);
      cpu::head_matmul_bf16w(&x[t * nh * K], 1, nh, nh * K, K, K, wb.data(), N, alone.data());
      ASSERT_EQ(0, std::memcmp(alone.data(), &batch[t * nh * N], alone.size() * 4)) << "T=" << T << " t=" << t;
    }
  }
}

// ---------------------------------------------------------------- latent attention

namespace {

struct LatentSetup {
  int64_t nh = 20, L = 64, dr = 16, bs = 4;  // 20 heads: two head blocks, one partial
  float scale = 0.11f;
};

// A sequence's cache rows, contiguous: [len, L + dr].
struct LatentSeq {
  int64_t len;
  std::vector<float> lat, rope;  // [len, L], [len, dr]
  std::vector<int32_t> table;
};

LatentSeq make_latent_seq(const LatentSetup& st, int64_t len, std::vector<int32_t> table, uint32_t seed) {
  return LatentSeq{len, rand_vec(len * st.L, seed), rand_vec(len * st.dr, seed + 100), std::move(table)};
}

void write_seq(const LatentSetup& st, const LatentSeq& s, std::vector<float>& cache) {
  std::vector<int64_t> slots(s.len);
  for (int64_t p = 0; p < s.len; ++p) slots[p] = s.table[p / st.bs] * st.bs + p % st.bs;
  cpu::latent_cache_write(s.lat.data(), s.rope.data(), s.len, slots.data(), st.L, st.dr, cache.data(),
                          cpu::CacheElem::F32);
}

// Reference for one (token, head): attends over positions [0, p] of s.
std::vector<double> ref_latent(const LatentSetup& st, const LatentSeq& s, int64_t p, const float* ql, const float* qr) {
  std::vector<double> sc(p + 1), out(st.L, 0.0);
  double mx = -1e300;
  for (int64_t j = 0; j <= p; ++j) {
    double d = 0;
    for (int64_t i = 0; i < st.L; ++i) d += static_cast<double>(ql[i]) * s.lat[j * st.L + i];
    for (int64_t i = 0; i < st.dr; ++i) d += static_cast<double>(qr[i]) * s.rope[j * st.dr + i];
    sc[j] = d * st.scale;
    mx = std::max(mx, sc[j]);
  }
  double sum = 0;
  for (auto& e : sc) sum += (e = std::exp(e - mx));
  for (int64_t j = 0; j <= p; ++j)
    for (int64_t i = 0; i < st.L; ++i) out[i] += sc[j] / sum * s.lat[j * st.L + i];
  return out;
}

}  // namespace

TEST(LatentCacheWrite, WritesRowsAndSkipsNegative) {
  const int64_t L = 6, dr = 2, T = 3;
  auto lat = rand_vec(T * L, 10), rope = rand_vec(T * dr, 11);
  std::vector<float> cache(5 * (L + dr), -7.0f);
  std::vector<int64_t> slots = {4, -1, 0};
  cpu::latent_cache_write(lat.data(), rope.data(), T, slots.data(), L, dr, cache.data(), cpu::CacheElem::F32);
  for (int64_t i = 0; i < L; ++i) {
    EXPECT_EQ(cache[4 * (L + dr) + i], lat[0 * L + i]);
    EXPECT_EQ(cache[0 * (L + dr) + i], lat[2 * L + i]);
  }
  for (int64_t i = 0; i < dr; ++i) {
    EXPECT_EQ(cache[4 * (L + dr) + L + i], rope[0 * dr + i]);
    EXPECT_EQ(cache[0 * (L + dr) + L + i], rope[2 * dr + i]);
  }
  for (int64_t s : {1, 2, 3})
    for (int64_t i = 0; i < L + dr; ++i) EXPECT_EQ(cache[s * (L + dr) + i], -7.0f);
}

TEST(LatentAttention, MatchesReferenceAndIsBatchInvariant) {
  ThreadGuard guard;
  LatentSetup st;
  const int64_t W = st.L + st.dr;
  // Three sequences with scrambled, interleaved physical blocks.
  std::vector<LatentSeq> seqs;
  seqs.push_back(make_latent_seq(st, 23, {9, 2, 14, 5, 0, 11}, 20));  // 6 blocks of 4
  seqs.push_back(make_latent_seq(st, 1, {7}, 21));
  seqs.push_back(make_latent_seq(st, 10, {3, 13, 1}, 22));
  std::vector<float> cache(16 * st.bs * W, NAN);  // unused rows stay NaN: reading one would show
  for (const auto& s : seqs) write_seq(st, s, cache);
  // One call: a prefill chunk of seq 0 (positions 15..22), seq 1's only token, all of seq 2.
  std::vector<int32_t> pos, seq_of;
  for (int32_t p = 15; p < 23; ++p) pos.push_back(p), seq_of.push_back(0);
  pos.push_back(0), seq_of.push_back(1);
  for (int32_t p = 0; p < 10; ++p) pos.push_back(p), seq_of.push_back(2);
  const int64_t T = static_cast<int64_t>(pos.size());
  std::vector<const int32_t*> bt(T);
  for (int64_t t = 0; t < T; ++t) bt[t] = seqs[seq_of[t]].table.data();
  auto ql = rand_vec(T * st.nh * st.L, 23), qr = rand_vec(T * st.nh * st.dr, 24);
  std::vector<float> batch(T * st.nh * st.L, NAN);
  cpu::set_num_threads(2);
  cpu::latent_attention(ql.data(), qr.data(), T, st.nh, st.L, st.dr, cache.data(), cpu::CacheElem::F32, st.bs,
                        bt.data(), pos.data(), st.scale, batch.data());
  const double tol = 2e-6 * std::max(1.0, max_abs(seqs[0].lat));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < st.nh; ++h) {
      const int64_t i0 = (t * st.nh + h);
      auto ref = ref_latent(st, seqs[seq_of[t]], pos[t], &ql[i0 * st.L], &qr[i0 * st.dr]);
      for (int64_t i = 0; i < st.L; ++i) ASSERT_NEAR(batch[i0 * st.L + i], ref[i], tol) << "t=" << t << " h=" << h;
    }
  // Each token alone, one thread: the same bits.
  cpu::set_num_threads(1);
  const int64_t row = st.nh * st.L;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> alone(row);
    cpu::latent_attention(&ql[t * row], &qr[t * st.nh * st.dr], 1, st.nh, st.L, st.dr, cache.data(),
                          cpu::CacheElem::F32, st.bs, &bt[t], &pos[t], st.scale, alone.data());
    ASSERT_EQ(0, std::memcmp(alone.data(), &batch[t * row], row * 4)) << "t=" << t;
  }
}

TEST(LatentAttention, GivesThePlainLoopsBits) {
  // The kernel's definition in plain loops (latent_attention.h: dot16 scores, softmax_in_place,
  // out += p_j c_j in position order) against the kernel, which shares each row read across the
  // tokens of a sequence and the heads of a block and runs the loops in vector form. Latent and
  // rope widths with and without a tail past the 16-float vectors; a 21-token chunk (tiles of
  // 8 + 8 + 5), a lone decode token and a 12-token first chunk in one call; 1 and 2 threads.
  ThreadGuard guard;
  for (auto [L, dr] : {std::pair<int64_t, int64_t>{64, 16}, {72, 8}, {512, 64}}) {
    LatentSetup st;
    st.L = L;
    st.dr = dr;
    st.bs = L == 72 ? 5 : 4;  // blocks of 4 rows are located by shifts, of 5 by division
    const int64_t W = L + dr;
    std::vector<LatentSeq> seqs;
    seqs.push_back(
        make_latent_seq(st, 81, {9, 2, 14, 5, 0, 11, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}, 40));
    seqs.push_back(make_latent_seq(st, 45, {7, 1, 13, 3, 33, 34, 35, 36, 37, 38, 39, 40}, 41));
    seqs.push_back(make_latent_seq(st, 12, {4, 6, 8}, 42));
    std::vector<float> cache(41 * st.bs * W, NAN);
    for (const auto& s : seqs) write_seq(st, s, cache);
    std::vector<int32_t> pos, seq_of;
    for (int32_t p = 60; p <= 80; ++p) pos.push_back(p), seq_of.push_back(0);
    pos.push_back(44), seq_of.push_back(1);
    for (int32_t p = 0; p < 12; ++p) pos.push_back(p), seq_of.push_back(2);
    const int64_t T = static_cast<int64_t>(pos.size());
    std::vector<const int32_t*> bt(T);
    for (int64_t t = 0; t < T; ++t) bt[t] = seqs[seq_of[t]].table.data();
    const auto ql = rand_vec(T * st.nh * L, 43), qr = rand_vec(T * st.nh * dr, 44);
    std::vector<float> want(T * st.nh * L, 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < st.nh; ++h) {
        const int64_t i0 = t * st.nh + h;
        std::vector<float> sc;
        std::vector<const float*> rows;
        for (int64_t p = 0; p <= pos[t]; ++p) {
          const float* c = &cache[(bt[t][p / st.bs] * st.bs + p % st.bs) * W];
          sc.push_back((cpu::detail::dot16(&ql[i0 * L], c, L) + cpu::detail::dot16(&qr[i0 * dr], c + L, dr)) *
                       st.scale);
          rows.push_back(c);
        }
        cpu::detail::softmax_in_place(sc.data(), static_cast<int64_t>(sc.size()));
        float* o = &want[i0 * L];
        for (size_t j = 0; j < sc.size(); ++j) {
          for (int64_t d = 0; d < L; ++d) {
            const float prod = sc[j] * rows[j][d];
            o[d] = o[d] + prod;
          }
        }
      }
    }
    for (int threads : {1, 2}) {
      cpu::set_num_threads(threads);
      std::vector<float> out(want.size(), NAN);
      cpu::latent_attention(ql.data(), qr.data(), T, st.nh, L, dr, cache.data(), cpu::CacheElem::F32, st.bs, bt.data(),
                            pos.data(), st.scale, out.data());
      ASSERT_EQ(0, std::memcmp(want.data(), out.data(), out.size() * 4))
          << "kv_lora " << L << ", rope " << dr << ", " << threads << " threads";
    }
  }
}

TEST(LatentAttention, HeadsSeeOnlyTheirOwnQuery) {
  // Each head's output is, bit for bit, a one-head call with that head's query alone, whichever
  // head block it falls in; heads given one query then give one result.
  LatentSetup st;
  auto s = make_latent_seq(st, 9, {2, 0, 1}, 30);
  std::vector<float> cache(3 * st.bs * (st.L + st.dr), NAN);
  write_seq(st, s, cache);
  const int32_t p = 8;
  const int32_t* bt = s.table.data();
  for (bool shared : {false, true}) {
    std::vector<float> ql(st.nh * st.L), qr(st.nh * st.dr);
    for (int64_t h = 0; h < st.nh; ++h) {
      const auto seed = static_cast<uint32_t>(shared ? 31 : 31 + 2 * h);
      const auto l = rand_vec(st.L, seed), r = rand_vec(st.dr, seed + 1);
      std::copy(l.begin(), l.end(), &ql[h * st.L]);
      std::copy(r.begin(), r.end(), &qr[h * st.dr]);
    }
    std::vector<float> out(st.nh * st.L);
    cpu::latent_attention(ql.data(), qr.data(), 1, st.nh, st.L, st.dr, cache.data(), cpu::CacheElem::F32, st.bs, &bt,
                          &p, st.scale, out.data());
    for (int64_t h = 0; h < st.nh; ++h) {
      std::vector<float> alone(st.L);
      cpu::latent_attention(&ql[h * st.L], &qr[h * st.dr], 1, 1, st.L, st.dr, cache.data(), cpu::CacheElem::F32, st.bs,
                            &bt, &p, st.scale, alone.data());
      ASSERT_EQ(0, std::memcmp(alone.data(), &out[h * st.L], st.L * 4)) << "h=" << h << (shared ? ", one query" : "");
      if (shared) {
        ASSERT_EQ(0, std::memcmp(&out[0], &out[h * st.L], st.L * 4)) << "h=" << h;
      }
    }
    if (!shared) {
      EXPECT_NE(0, std::memcmp(&out[0], &out[st.L], st.L * 4)) << "two queries, one result";
    }
  }
}
