// The CPU backend's expert-parallel row movement (gather_rows, combine_rows; kernels/cpu/
// expert_rows.h) against naive loops, bit for bit: repeated and unordered row indices, zero rows,
// kept rows, tokens with empty ranges (zeros, whatever out held), and combine_rows fed in
// ascending expert order reproducing expert_combine exactly (the property the expert-parallel
// combine relies on).
// Also ExpertDispatch's combine into a larger output (rows outside the tokens' range zeroed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/moe_router.h"
#include "common/backend_data.h"
#include "compute/backend.h"
#include "cpu/expert_permute.h"
#include "cpu/expert_rows.h"
#include "cpu/threads.h"

using namespace shardlm;

namespace {

using test::down;
using test::randn;
using test::up;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(CpuExpertRows, GatherRowsCopiesTheIndexedRows) {
  auto b = make_backend("cpu");
  const int64_t R = 11, H = 37;
  const auto src = randn(static_cast<size_t>(R * H), 1);
  std::mt19937 g(2);
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{40}}) {
    std::vector<int32_t> rows(static_cast<size_t>(n));
    // Repeats and any order; -1 (zeros) and kKeepRow (the row left as it was) too.
    for (auto& r : rows) r = static_cast<int32_t>(g() % (R + 2)) - 2;
    if (n > 0) rows[0] = cpu::kKeepRow;
    float* d_src = up(*b, src);
    int32_t* d_rows = up(*b, rows);
    float* d_dst = up(*b, std::vector<float>(static_cast<size_t>(n * H), -3.0f));
    b->gather_rows(d_src, H, d_rows, n, d_dst);
    b->synchronize();
    std::vector<float> want(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < H; ++c)
        want[i * H + c] = rows[i] == cpu::kKeepRow ? -3.0f : rows[i] < 0 ? 0.0f : src[rows[i] * H + c];
    EXPECT_TRUE(same_bits(down(*b, d_dst, want.size()), want)) << "n " << n;
    b->free(d_src);
    b->free(d_rows);
    b->free(d_dst);
  }
}

TEST(CpuExpertRows, CombineRowsSumsInIndexOrder) {
  auto b = make_backend("cpu");
  const int64_t R = 9, H = 33, T = 7;
  const auto y = randn(static_cast<size_t>(R * H), 3);
  // Ranges of 3, 0, 1, 4, 0, 2, 0 entries: tokens 1, 4 and 6 get zeros.
  const std::vector<int32_t> count = {3, 0, 1, 4, 0, 2, 0};
  std::vector<int32_t> start(static_cast<size_t>(T + 1), 0);
  for (int64_t t = 0; t < T; ++t) start[t + 1] = start[t] + count[t];
  const int32_t n = start[T];
  std::mt19937 g(4);
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (auto& r : rows) r = static_cast<int32_t>(g() % R);
  const auto w = randn(static_cast<size_t>(n), 5);

  float* d_y = up(*b, y);
  int32_t* d_start = up(*b, start);
  int32_t* d_rows = up(*b, rows);
  float* d_w = up(*b, w);
  float* d_out = up(*b, randn(static_cast<size_t>(T * H), 6));  // overwritten, not added to
  b->combine_rows(d_y, H, d_start, d_rows, d_w, T, d_out);
  std::vector<float> want(static_cast<size_t>(T * H), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int32_t i = start[t]; i < start[t + 1]; ++i) {
        const float term = w[i] * y[rows[i] * H + c];
        acc = acc + term;
      }
      want[t * H + c] = acc;
    }
  const auto got = down(*b, d_out, want.size());
  EXPECT_TRUE(same_bits(got, want));
  for (int64_t c = 0; c < H; ++c) EXPECT_EQ(got[1 * H + c], 0.0f);

  b->combine_rows(d_y, H, d_start, d_rows, d_w, 0, d_out);  // no token: nothing happens
  EXPECT_TRUE(same_bits(down(*b, d_out, want.size()), want));
  for (void* p : {static_cast<void*>(d_y), static_cast<void*>(d_start), static_cast<void*>(d_rows),
                  static_cast<void*>(d_w), static_cast<void*>(d_out)})
    b->free(p);
}

// Each token's local slots listed in ascending expert id: combine_rows gives expert_combine's bits.
TEST(CpuExpertRows, CombineRowsInExpertOrderMatchesExpertCombine) {
  auto b = make_backend("cpu");
  const int64_t T = 23, E = 6, e0 = 2, k = 3, H = 29, P = T * k;
  const int64_t Eall = 12;
  std::mt19937 g(7);
  std::vector<int32_t> ids(static_cast<size_t>(P));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(Eall));
    for (int64_t e = 0; e < Eall; ++e) all[e] = static_cast<int32_t>(e);
    std::shuffle(all.begin(), all.end(), g);
    std::copy_n(all.begin(), k, ids.begin() + t * k);  // distinct, best-first order arbitrary
  }
  const auto w = randn(static_cast<size_t>(P), 8);
  int32_t* d_ids = up(*b, ids);
  int32_t* d_off = up(*b, std::vector<int32_t>(static_cast<size_t>(E + 1)));
  int32_t* d_slot_row = up(*b, std::vector<int32_t>(static_cast<size_t>(P)));
  int32_t* d_row_pair = up(*b, std::vector<int32_t>(static_cast<size_t>(P)));
  b->expert_permute(d_ids, T, k, e0, E, nullptr, d_off, d_slot_row, d_row_pair, nullptr);
  const auto off = down(*b, d_off, static_cast<size_t>(E + 1));
  const auto slot_row = down(*b, d_slot_row, static_cast<size_t>(P));
  const int64_t rows = off[E];
  const auto y = randn(static_cast<size_t>(std::max<int64_t>(rows, 1) * H), 9);
  float* d_y = up(*b, y);
  float* d_w = up(*b, w);
  float* d_want = up(*b, std::vector<float>(static_cast<size_t>(T * H)));
  b->expert_combine(d_y, H, d_ids, d_w, d_slot_row, T, k, d_want);

  std::vector<int32_t> start(static_cast<size_t>(T + 1), 0), list;
  std::vector<float> lw;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> js;
    for (int64_t j = 0; j < k; ++j)
      if (slot_row[t * k + j] >= 0) js.push_back(j);
    std::sort(js.begin(), js.end(), [&](int64_t a, int64_t c) { return ids[t * k + a] < ids[t * k + c]; });
    for (int64_t j : js) {
      list.push_back(slot_row[t * k + j]);
      lw.push_back(w[t * k + j]);
    }
    start[t + 1] = static_cast<int32_t>(list.size());
  }
  int32_t* d_start = up(*b, start);
  int32_t* d_list = up(*b, list);
  float* d_lw = up(*b, lw);
  float* d_got = up(*b, std::vector<float>(static_cast<size_t>(T * H), 5.0f));
  b->combine_rows(d_y, H, d_start, d_list, d_lw, T, d_got);
  EXPECT_TRUE(same_bits(down(*b, d_got, static_cast<size_t>(T * H)), down(*b, d_want, static_cast<size_t>(T * H))));
  for (void* p : {static_cast<void*>(d_ids), static_cast<void*>(d_off), static_cast<void*>(d_slot_row),
                  static_cast<void*>(d_row_pair), static_cast<void*>(d_y), static_cast<void*>(d_w),
                  static_cast<void*>(d_want), static_cast<void*>(d_start), static_cast<void*>(d_list),
                  static_cast<void*>(d_lw), static_cast<void*>(d_got)})
    b->free(p);
}

// combine(out, out_rows, first): the tokens' rows at first.., the others zero; the same bits as a
// combine into exactly T rows. Zero tokens: every row zero.
// Rows and tokens spread over the kernels' threads (past 32768 values) give the one thread's
// bits: gather_rows, combine_rows, expert_gather and expert_combine, each output row on its own.
TEST(CpuExpertRows, ThreadsGiveOneThreadsBits) {
  const int64_t T = 300, k = 4, E = 16, H = 256, R = T * k;
  const auto x = randn(static_cast<size_t>(T * H), 7), y = randn(static_cast<size_t>(R * H), 8);
  std::mt19937 g(9);
  std::vector<int32_t> ids(static_cast<size_t>(R)), rows(static_cast<size_t>(R)), start(static_cast<size_t>(T + 1));
  std::vector<float> w(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    ids[i] = static_cast<int32_t>(g() % E);
    rows[i] = static_cast<int32_t>(g() % R);
    w[i] = static_cast<float>(g() % 1000) / 999.0f;
  }
  for (int64_t t = 0; t <= T; ++t) start[t] = static_cast<int32_t>(t * k);
  std::vector<int32_t> offsets(static_cast<size_t>(E + 1)), slot_row(static_cast<size_t>(R)),
      row_pair(static_cast<size_t>(R));
  cpu::expert_permute(ids.data(), T, k, 0, E, nullptr, offsets.data(), slot_row.data(), row_pair.data(), nullptr);
  const auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    std::vector<float> gathered(static_cast<size_t>(R * H)), combined(static_cast<size_t>(T * H)),
        permuted(static_cast<size_t>(R * H)), summed(static_cast<size_t>(T * H));
    cpu::gather_rows(y.data(), H, rows.data(), R, gathered.data());
    cpu::combine_rows(y.data(), H, start.data(), rows.data(), w.data(), T, combined.data());
    const int32_t n = offsets[E];
    cpu::expert_gather(x.data(), H, k, row_pair.data(), &n, R, permuted.data());
    cpu::expert_combine(y.data(), H, ids.data(), w.data(), slot_row.data(), T, k, summed.data());
    return std::vector<std::vector<float>>{gathered, combined, permuted, summed};
  };
  const int before = cpu::num_threads();
  const auto one = run(1), four = run(4);
  cpu::set_num_threads(before);
  const char* what[] = {"gather_rows", "combine_rows", "expert_gather", "expert_combine"};
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_bits(one[i], four[i])) << what[i];
}

TEST(CpuExpertRows, DispatchCombineIntoALargerOutput) {
  auto b = make_backend("cpu");
  const int64_t E = 8, k = 2, H = 16;
  for (const int64_t T : {int64_t{0}, int64_t{5}}) {
    const auto logits = randn(static_cast<size_t>(T * E), 10);
    Routing r;
    route_softmax_topk(logits.data(), T, E, k, true, 1.0, &r);
    const auto x = randn(static_cast<size_t>(T * H), 11);
    Scratch scratch(*b);
    ExpertDispatch d(nullptr, E, H);
    d.dispatch(scratch, x.data(), r);
    ASSERT_EQ(d.rows(), T * k);
    const auto y = randn(static_cast<size_t>(T * k * H), 12);
    std::copy(y.begin(), y.end(), d.output());
    std::vector<float> exact(static_cast<size_t>(T * H), 9.0f);
    d.combine(scratch, exact.data());
    const int64_t first = 3, out_rows = T + 5;
    std::vector<float> big(static_cast<size_t>(out_rows * H), 9.0f);
    d.combine(scratch, big.data(), out_rows, first);
    for (int64_t u = 0; u < out_rows; ++u)
      for (int64_t c = 0; c < H; ++c) {
        const float want = u >= first && u < first + T ? exact[(u - first) * H + c] : 0.0f;
        ASSERT_EQ(std::memcmp(&big[u * H + c], &want, sizeof(float)), 0) << "T " << T << " row " << u << " col " << c;
      }
    EXPECT_EQ(d.dispatch_bytes, 0);
    EXPECT_EQ(d.combine_bytes, 0);
  }
}

}  // namespace
