// The fixed-capacity expert exchange's index plans (kernels/cpu/expert_exchange.h) driven through
// a whole exchange between ep simulated ranks in one process: each rank plans its share, the
// blocks move as an all-to-all would move them, every owner runs its rows per local expert
// through a stand-in expert (y = (e + 1) * x + e, distinct per expert), the results go back and
// expert_combine sums them. With room enough the output must be, bit for bit, the single-rank
// layout's (expert_permute, the same stand-in experts, expert_combine) for every token of every
// rank, zeros for padding tokens; and the flag must be raised exactly when a block needs more
// records or pairs than it holds (counted here by brute force), with every index in range.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/expert_exchange.h"
#include "cpu/expert_permute.h"
#include "cpu/expert_rows.h"

using namespace shardlm;

namespace {

struct Routed {
  int64_t T, k, E;
  std::vector<int32_t> ids, pos;
  std::vector<float> w, x;
};

// T tokens with k distinct experts of E each (skewed towards the low experts when `skew`), every
// third token a padding one when `padding`.
Routed make_routing(int64_t T, int64_t k, int64_t E, int64_t H, bool skew, bool padding, uint32_t seed) {
  std::mt19937 g(seed);
  Routed r{T, k, E, {}, {}, {}, {}};
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    if (skew) {
      std::partial_sort(all.begin(), all.begin() + k, all.end(), [&](int32_t a, int32_t b) {
        return a + static_cast<int32_t>(g() % 3) < b + static_cast<int32_t>(g() % 3);
      });
    } else {
      std::shuffle(all.begin(), all.end(), g);
    }
    for (int64_t j = 0; j < k; ++j) {
      r.ids.push_back(all[j]);
      r.w.push_back(static_cast<float>(g() % 1000) / 997.0f);
    }
    r.pos.push_back(padding && t % 3 == 2 ? -1 : static_cast<int32_t>(t));
  }
  std::normal_distribution<float> d;
  r.x.resize(static_cast<size_t>(T * H));
  for (float& v : r.x) v = d(g);
  return r;
}

float stand_in(int64_t e, float x) { return static_cast<float>(e + 1) * x + static_cast<float>(e); }

// The single-rank result of the step: every expert local, rows per expert, expert_combine.
std::vector<float> single_rank(const Routed& r, int64_t H) {
  const int64_t P = r.T * r.k;
  std::vector<int32_t> offsets(static_cast<size_t>(r.E + 1)), slot_row(static_cast<size_t>(P)),
      row_pair(static_cast<size_t>(P));
  cpu::expert_permute(r.ids.data(), r.T, r.k, 0, r.E, r.pos.data(), offsets.data(), slot_row.data(), row_pair.data(),
                      nullptr);
  std::vector<float> yp(static_cast<size_t>(std::max<int64_t>(P, 1) * H));
  for (int64_t e = 0; e < r.E; ++e)
    for (int32_t row = offsets[e]; row < offsets[e + 1]; ++row)
      for (int64_t c = 0; c < H; ++c) yp[row * H + c] = stand_in(e, r.x[(row_pair[row] / r.k) * H + c]);
  std::vector<float> out(static_cast<size_t>(r.T * H));
  cpu::expert_combine(yp.data(), H, r.ids.data(), r.w.data(), slot_row.data(), r.T, r.k, out.data());
  return out;
}

struct Exchanged {
  std::vector<float> out;  // [T, H], every rank's share
  bool overflow = false;
};

// 1 + the last row that is not padding: the real rows a send plan shares out.
int64_t real_rows(const Routed& r) {
  int64_t n = 0;
  for (int64_t t = 0; t < r.T; ++t)
    if (r.pos[t] >= 0) n = t + 1;
  return n;
}

// The step over `ep` ranks, rank p routing share p of ep of the real rows (all ranks read the same
// x, as tp ranks do); blocks of C records (their rows, then their meta's) and Cc returned rows.
Exchanged exchange(const Routed& r, int64_t H, int64_t ep, int64_t C, int64_t Cc) {
  cpu::ExchangeShape s;
  s.ep = ep;
  s.L = r.E / ep;
  s.k = r.k;
  s.C = C;
  s.Cc = Cc;
  s.H = H;
  const int64_t R = s.block_rows(), T = r.T, k = r.k, n = real_rows(r);
  EXPECT_GE(s.meta_rows() * H, s.meta());
  EXPECT_LT((s.meta_rows() - 1) * H, s.meta());
  std::vector<std::vector<int32_t>> rec(ep), pair_row(ep);
  std::vector<std::vector<float>> send(ep);
  std::vector<int64_t> counts(static_cast<size_t>(r.E), 0);
  int32_t flag = 0;
  for (int64_t p = 0; p < ep; ++p) {
    rec[p].assign(static_cast<size_t>(ep * R), 7);
    pair_row[p].assign(static_cast<size_t>(T * k), 7);
    send[p].assign(static_cast<size_t>(ep * R * H), 1.0f);
    const int64_t t0 = n * p / ep, t1 = n * (p + 1) / ep;
    cpu::expert_send_plan(s, r.ids.data(), T, cpu::RowShare{p, ep}, r.pos.data(), rec[p].data(), send[p].data(),
                          pair_row[p].data(), counts.data(), &flag);
    // The records' rows over the meta rows the plan wrote, which gather_rows keeps.
    cpu::gather_rows(r.x.data(), H, rec[p].data(), ep * R, send[p].data());
    for (int64_t i = 0; i < ep * R; ++i) {
      if (i % R >= C) {
        EXPECT_EQ(rec[p][i], cpu::kKeepRow) << "meta row " << i << " of rank " << p;
      } else {
        EXPECT_TRUE(rec[p][i] == -1 || (rec[p][i] >= t0 && rec[p][i] < t1)) << "record " << i << " of rank " << p;
      }
    }
  }
  // The routing's loads, whatever the capacity.
  std::vector<int64_t> want_counts(static_cast<size_t>(r.E), 0);
  for (int64_t i = 0; i < T * k; ++i)
    if (r.pos[i / k] >= 0) ++want_counts[r.ids[i]];
  EXPECT_EQ(counts, want_counts);
  // Owners: the blocks for them, their rows, the stand-in experts, the returned blocks.
  std::vector<std::vector<float>> back(ep);
  for (int64_t o = 0; o < ep; ++o) {
    std::vector<float> rrows(static_cast<size_t>(ep * R * H));
    for (int64_t src = 0; src < ep; ++src)
      std::copy_n(send[src].begin() + o * R * H, R * H, rrows.begin() + src * R * H);
    std::vector<int32_t> offsets(static_cast<size_t>(s.L + 1)), row_src(static_cast<size_t>(ep * Cc), -7),
        back_row(static_cast<size_t>(ep * Cc), 7);
    cpu::expert_recv_plan(s, rrows.data(), offsets.data(), row_src.data(), back_row.data());
    EXPECT_LE(offsets[s.L], ep * Cc);
    std::vector<float> xp(static_cast<size_t>(std::max<int64_t>(ep * Cc * H, 1)));
    const int32_t rows = offsets[s.L];
    cpu::expert_gather(rrows.data(), H, 1, row_src.data(), &rows, ep * Cc, xp.data());
    std::vector<float> yp(xp.size(), 0.0f);
    for (int64_t e = 0; e < s.L; ++e)
      for (int32_t row = offsets[e]; row < offsets[e + 1]; ++row) {
        EXPECT_GE(row_src[row], 0);
        EXPECT_LT(row_src[row] % R, C);  // a record's row, never a meta row
        EXPECT_LT(row_src[row], ep * R);
        for (int64_t c = 0; c < H; ++c) yp[row * H + c] = stand_in(o * s.L + e, xp[row * H + c]);
      }
    for (int32_t b : back_row) EXPECT_TRUE(b == -1 || (b >= 0 && b < rows));
    back[o].assign(static_cast<size_t>(std::max<int64_t>(ep * Cc * H, 1)), 0.0f);
    cpu::gather_rows(yp.data(), H, back_row.data(), ep * Cc, back[o].data());
  }
  Exchanged ex;
  ex.out.assign(static_cast<size_t>(T * H), 0.0f);
  for (int64_t p = 0; p < ep; ++p) {
    std::vector<float> got(static_cast<size_t>(std::max<int64_t>(ep * Cc * H, 1)));
    for (int64_t o = 0; o < ep; ++o) std::copy_n(back[o].begin() + p * Cc * H, Cc * H, got.begin() + o * Cc * H);
    for (int32_t row : pair_row[p]) EXPECT_TRUE(row == -1 || (row >= 0 && row < ep * Cc));
    std::vector<float> out(static_cast<size_t>(T * H), 5.0f);
    cpu::expert_combine(got.data(), H, r.ids.data(), r.w.data(), pair_row[p].data(), T, k, out.data());
    const int64_t t0 = n * p / ep, t1 = n * (p + 1) / ep;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < H; ++c) {
        if (t >= t0 && t < t1) {
          ex.out[t * H + c] = out[t * H + c];
        } else {
          EXPECT_EQ(out[t * H + c], 0.0f) << "rank " << p << " wrote token " << t << " outside its share";
        }
      }
    }
  }
  ex.overflow = flag != 0;
  return ex;
}

// Brute force: the most records and pairs any (source, owner) block needs.
void needed(const Routed& r, int64_t ep, int64_t* records, int64_t* pairs) {
  const int64_t L = r.E / ep, k = r.k, real = real_rows(r);
  *records = *pairs = 0;
  for (int64_t p = 0; p < ep; ++p) {
    const int64_t t0 = real * p / ep, t1 = real * (p + 1) / ep;
    for (int64_t o = 0; o < ep; ++o) {
      int64_t rc = 0, pc = 0;
      for (int64_t t = t0; t < t1; ++t) {
        if (r.pos[t] < 0) continue;
        int64_t n = 0;
        for (int64_t j = 0; j < k; ++j) n += r.ids[t * k + j] / L == o;
        rc += n > 0;
        pc += n;
      }
      *records = std::max(*records, rc);
      *pairs = std::max(*pairs, pc);
    }
  }
}

TEST(CpuExpertExchange, WorstCaseBlocksGiveTheSingleRankBits) {
  // Rows of 1 and 5 floats put a block's meta over several rows, 64 over one.
  for (const auto& [T, k, E, ep, H] : std::vector<std::array<int64_t, 5>>{{1, 1, 2, 2, 5},
                                                                          {7, 2, 8, 2, 5},
                                                                          {16, 2, 8, 4, 1},
                                                                          {16, 2, 8, 4, 64},
                                                                          {24, 6, 12, 3, 5},
                                                                          {9, 8, 8, 8, 5},
                                                                          {33, 4, 64, 8, 5},
                                                                          {5, 3, 6, 1, 5}}) {
    for (const bool padding : {false, true}) {
      const Routed r = make_routing(T, k, E, H, false, padding, static_cast<uint32_t>(T * 31 + k + padding));
      const int64_t S = (T + ep - 1) / ep, kl = std::min(k, E / ep);
      const Exchanged ex = exchange(r, H, ep, S, S * kl);
      EXPECT_FALSE(ex.overflow) << T << " tokens, top-" << k << " of " << E << " over " << ep;
      const std::vector<float> want = single_rank(r, H);
      ASSERT_EQ(ex.out.size(), want.size());
      EXPECT_EQ(std::memcmp(ex.out.data(), want.data(), want.size() * sizeof(float)), 0)
          << T << " tokens, top-" << k << " of " << E << " over " << ep << (padding ? ", padding" : "");
    }
  }
}

TEST(CpuExpertExchange, OverflowIsFlaggedExactlyWhenABlockIsShort) {
  const int64_t H = 3, T = 40, k = 4, E = 16, ep = 4;
  const Routed r = make_routing(T, k, E, H, true, true, 11);  // skewed: the low experts' owner is busy
  int64_t records = 0, pairs = 0;
  needed(r, ep, &records, &pairs);
  ASSERT_GT(records, 1);
  ASSERT_GT(pairs, 1);
  // Room exactly: no flag, the single-rank bits.
  Exchanged ex = exchange(r, H, ep, records, pairs);
  EXPECT_FALSE(ex.overflow);
  const std::vector<float> want = single_rank(r, H);
  EXPECT_EQ(std::memcmp(ex.out.data(), want.data(), want.size() * sizeof(float)), 0);
  // One record or one pair short: flagged (the indices stay in range, checked inside).
  EXPECT_TRUE(exchange(r, H, ep, records - 1, pairs).overflow);
  EXPECT_TRUE(exchange(r, H, ep, records, pairs - 1).overflow);
  EXPECT_TRUE(exchange(r, H, ep, 1, 1).overflow);
  // Blocks of nothing at all (a step of no tokens anywhere) move nothing and flag nothing.
  Routed none = make_routing(3, k, E, H, false, false, 3);
  std::fill(none.pos.begin(), none.pos.end(), -1);
  ex = exchange(none, H, ep, 1, 1);
  EXPECT_FALSE(ex.overflow);
  for (float v : ex.out) EXPECT_EQ(v, 0.0f);
}

// A captured step's rows are its real rows, then padding (pos < 0): each tp rank's share is of
// the real rows, as an eager step of them is split, not of the padded count. 10 rows of which 7
// are real, over tp 2: rows [0, 3) and [3, 7), not [0, 5) and [5, 10).
TEST(CpuExpertExchange, SharesFollowTheRealRows) {
  const int64_t T = 10, k = 2, E = 4, H = 2;
  Routed r = make_routing(T, k, E, H, false, false, 5);
  for (int64_t t = 7; t < T; ++t) r.pos[t] = -1;
  cpu::ExchangeShape s;
  s.ep = 1;
  s.L = E;
  s.k = k;
  s.C = T;
  s.Cc = T * k;
  s.H = H;
  for (int64_t rank = 0; rank < 2; ++rank) {
    std::vector<int32_t> rec(static_cast<size_t>(s.block_rows()), 7), pair_row(static_cast<size_t>(T * k), 7);
    std::vector<float> blocks(static_cast<size_t>(s.block_rows() * H));
    int32_t flag = 0;
    cpu::expert_send_plan(s, r.ids.data(), T, cpu::RowShare{rank, 2}, r.pos.data(), rec.data(), blocks.data(),
                          pair_row.data(), nullptr, &flag);
    const int64_t t0 = rank == 0 ? 0 : 3, t1 = rank == 0 ? 3 : 7;
    for (int64_t i = 0; i < T; ++i) EXPECT_EQ(rec[i], i < t1 - t0 ? t0 + i : -1) << "rank " << rank << " record " << i;
    EXPECT_EQ(cpu::block_meta(s, blocks.data(), 0)[0], t1 - t0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(pair_row[t * k + j] >= 0, t >= t0 && t < t1) << "token " << t;
    EXPECT_EQ(flag, 0);
  }
}

}  // namespace
