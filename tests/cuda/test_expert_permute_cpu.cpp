// kernels/cpu/expert_permute (the reference of the CUDA permutation kernels) against a naive
// loop: rows per local expert in (token, slot) order, padding tokens (pos < 0) left out, the
// per-expert counts added up, the gather, and the combine summed in ascending expert id. Runs
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/expert_permute.h"

namespace shardlm {
namespace {

struct Case {
  int64_t T, k, total_experts, e0, E, H;
};

// Distinct experts per token, drawn from [0, total).
std::vector<int32_t> random_ids(int64_t T, int64_t k, int64_t total, std::mt19937& gen) {
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<int32_t> all(static_cast<size_t>(total));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    std::copy_n(all.begin(), k, ids.begin() + t * k);
  }
  return ids;
}

// masked: every fifth token, from the third, is a padding row (pos -1).
void check(const Case& c, uint32_t seed, bool masked = false) {
  std::mt19937 gen(seed);
  const std::vector<int32_t> ids = random_ids(c.T, c.k, c.total_experts, gen);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.T * c.H)), w(static_cast<size_t>(c.T * c.k));
  for (auto& v : x) v = dist(gen);
  for (auto& v : w) v = dist(gen);

  std::vector<int32_t> pos(static_cast<size_t>(c.T));
  for (int64_t t = 0; t < c.T; ++t) pos[t] = masked && t % 5 == 2 ? -1 : static_cast<int32_t>(t + 3);
  std::vector<int32_t> offsets(static_cast<size_t>(c.E + 1)), slot_row(ids.size()), row_pair(ids.size(), -7);
  std::vector<int64_t> counts(static_cast<size_t>(c.E), 3);  // added to
  cpu::expert_permute(ids.data(), c.T, c.k, static_cast<int32_t>(c.e0), c.E, masked ? pos.data() : nullptr,
                      offsets.data(), slot_row.data(), row_pair.data(), counts.data());

  // Naive: for each local expert in turn, scan the pairs in order.
  std::vector<int32_t> want_pair, want_offsets = {0}, want_slot(ids.size(), -1);
  for (int64_t e = 0; e < c.E; ++e) {
    for (int64_t i = 0; i < c.T * c.k; ++i) {
      if (ids[i] == c.e0 + e && pos[i / c.k] >= 0) {
        want_slot[i] = static_cast<int32_t>(want_pair.size());
        want_pair.push_back(static_cast<int32_t>(i));
      }
    }
    want_offsets.push_back(static_cast<int32_t>(want_pair.size()));
  }
  ASSERT_EQ(offsets, want_offsets);
  ASSERT_EQ(slot_row, want_slot);
  for (int64_t e = 0; e < c.E; ++e) EXPECT_EQ(counts[e], 3 + want_offsets[e + 1] - want_offsets[e]) << "expert " << e;
  const int64_t rows = offsets[c.E];
  ASSERT_TRUE(std::equal(want_pair.begin(), want_pair.end(), row_pair.begin()));

  // The gather takes the row count from the offsets (backend memory) and stops there, under max_rows.
  std::vector<float> xp(static_cast<size_t>(c.T * c.k * c.H) + 1, 42.0f);
  cpu::expert_gather(x.data(), c.H, c.k, row_pair.data(), offsets.data() + c.E, c.T * c.k, xp.data());
  EXPECT_EQ(xp[rows * c.H], 42.0f) << "the gather wrote past the routed rows";
  xp.resize(static_cast<size_t>(rows * c.H));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < c.H; ++h) ASSERT_EQ(xp[r * c.H + h], x[(want_pair[r] / c.k) * c.H + h]);

  std::vector<float> yp(xp.size());
  for (auto& v : yp) v = dist(gen);
  std::vector<float> out(static_cast<size_t>(c.T * c.H), 99.0f);
  cpu::expert_combine(yp.data(), c.H, ids.data(), w.data(), slot_row.data(), c.T, c.k, out.data());
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < c.H; ++h) {
      volatile float acc = 0.0f;  // volatile: one rounding per product and per sum, like the kernel
      for (int64_t e = c.e0; e < c.e0 + c.E; ++e) {
        for (int64_t j = 0; j < c.k; ++j) {
          if (ids[t * c.k + j] != e || want_slot[t * c.k + j] < 0) continue;  // padding: no expert
          volatile float prod = w[t * c.k + j] * yp[want_slot[t * c.k + j] * c.H + h];
          acc = acc + prod;
        }
      }
      ASSERT_EQ(out[t * c.H + h], acc) << "token " << t << " column " << h;
    }
  }
}

TEST(ExpertPermuteCpu, AllExpertsLocal) { check({37, 2, 8, 0, 8, 16}, 1); }
TEST(ExpertPermuteCpu, SliceOfALargerSet) { check({200, 8, 256, 64, 32, 24}, 2); }
TEST(ExpertPermuteCpu, LastSlice) { check({64, 8, 384, 336, 48, 8}, 3); }
TEST(ExpertPermuteCpu, NoTokens) { check({0, 8, 64, 0, 16, 8}, 4); }
TEST(ExpertPermuteCpu, PaddingRowsGoToNoExpert) {
  check({37, 2, 8, 0, 8, 16}, 5, true);
  check({200, 8, 256, 64, 32, 24}, 6, true);
}

}  // namespace
}  // namespace shardlm
