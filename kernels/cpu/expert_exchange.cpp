#include "cpu/expert_exchange.h"

#include <algorithm>
#include <vector>

namespace shardlm::cpu {

void expert_send_plan(const ExchangeShape& s, const int32_t* topk_ids, int64_t T, RowShare share, const int32_t* pos,
                      int32_t* rec_token, float* blocks, int32_t* pair_row, int64_t* counts, int32_t* overflow) {
  const int64_t ep = s.ep, L = s.L, k = s.k, kl = s.kl(), R = s.block_rows();
  int64_t real = pos ? 0 : T;  // 1 + the last real row
  if (pos)
    for (int64_t t = 0; t < T; ++t)
      if (pos[t] >= 0) real = t + 1;
  const int64_t t0 = share.begin(real), t1 = share.end(real);
  std::fill(pair_row, pair_row + T * k, -1);
  std::vector<int64_t> base(static_cast<size_t>(L));
  std::vector<int32_t> local(static_cast<size_t>(k));  // a token's experts on the block's rank
  for (int64_t p = 0; p < ep; ++p) {
    int32_t* rec = rec_token + p * R;
    int32_t* m = block_meta(s, blocks, p);
    std::fill(rec, rec + s.C, -1);
    std::fill(rec + s.C, rec + R, kKeepRow);
    std::fill(m, m + s.meta_rows() * s.H, -1);
    std::fill(base.begin(), base.end(), 0);
    // The block's records, ascending token, each with its experts on p ascending (top-k ids are
    // distinct); base[e] counts the kept records' pairs per local expert.
    int64_t n = 0;
    for (int64_t t = t0; t < t1; ++t) {
      if (pos && pos[t] < 0) continue;
      int64_t used = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = topk_ids[t * k + j] - p * L;
        if (e < 0 || e >= L) continue;
        if (counts) ++counts[topk_ids[t * k + j]];
        local[used++] = static_cast<int32_t>(e);
      }
      if (used == 0) continue;
      if (n >= s.C) {
        *overflow = 1;
        continue;
      }
      std::sort(local.begin(), local.begin() + used);
      rec[n] = static_cast<int32_t>(t);
      for (int64_t j = 0; j < used; ++j) {
        m[1 + n * kl + j] = local[j];
        ++base[local[j]];
      }
      ++n;
    }
    m[0] = static_cast<int32_t>(n);
    // Pair q: the (local expert, record) order over the kept records.
    int64_t run = 0;
    for (int64_t e = 0; e < L; ++e) {
      const int64_t c = base[e];
      base[e] = run;
      run += c;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = rec[i];
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = topk_ids[t * k + j] - p * L;
        if (e < 0 || e >= L) continue;
        const int64_t q = base[e]++;
        if (q < s.Cc) {
          pair_row[t * k + j] = static_cast<int32_t>(p * s.Cc + q);
        } else {
          *overflow = 1;
        }
      }
    }
  }
}

void expert_recv_plan(const ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                      int32_t* back_row) {
  const int64_t ep = s.ep, L = s.L, kl = s.kl(), R = s.block_rows();
  std::fill(back_row, back_row + ep * s.Cc, -1);
  // Pairs per (source, local expert), and how many of them fit in the source's returned block.
  std::vector<int64_t> kept(static_cast<size_t>(ep * L), 0), first_q(static_cast<size_t>(ep * L), 0);
  // f(record i, local expert e) for each pair of source src's block, in (record, slot) order.
  auto for_pairs = [&](int64_t src, auto f) {
    const int32_t* m = block_meta(s, blocks, src);
    const int64_t records = std::clamp<int64_t>(m[0], 0, s.C);
    for (int64_t i = 0; i < records; ++i)
      for (int64_t j = 0; j < kl; ++j) {
        const int32_t e = m[1 + i * kl + j];
        if (e >= 0 && e < L) f(i, e);
      }
  };
  for (int64_t src = 0; src < ep; ++src) {
    std::vector<int64_t> cnt(static_cast<size_t>(L), 0);
    for_pairs(src, [&](int64_t, int32_t e) { ++cnt[e]; });
    int64_t run = 0;
    for (int64_t e = 0; e < L; ++e) {
      first_q[src * L + e] = run;
      kept[src * L + e] = std::clamp<int64_t>(s.Cc - run, 0, cnt[e]);
      run += cnt[e];
    }
  }
  // Owner rows: expert-major, then source.
  std::vector<int64_t> first_row(static_cast<size_t>(ep * L));
  int64_t r = 0;
  for (int64_t e = 0; e < L; ++e) {
    offsets[e] = static_cast<int32_t>(r);
    for (int64_t src = 0; src < ep; ++src) {
      first_row[src * L + e] = r;
      r += kept[src * L + e];
    }
  }
  offsets[L] = static_cast<int32_t>(r);
  for (int64_t src = 0; src < ep; ++src) {
    std::vector<int64_t> seen(static_cast<size_t>(L), 0);
    for_pairs(src, [&](int64_t i, int32_t e) {
      const int64_t n = seen[e]++;
      if (n >= kept[src * L + e]) return;
      const int64_t row = first_row[src * L + e] + n;
      row_src[row] = static_cast<int32_t>(src * R + i);
      back_row[src * s.Cc + first_q[src * L + e] + n] = static_cast<int32_t>(row);
    });
  }
}

}  // namespace shardlm::cpu
