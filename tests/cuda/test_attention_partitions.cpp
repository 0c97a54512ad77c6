// The host side of the split attention launch (kernels/cuda/attention_partitions.h): which
// partitions a token's positions fall in, and when a launch splits. Runs without CUDA; the kernels
// that follow these rules are checked against the CPU on a GPU (test_cuda_attention.cpp).
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/attention_partitions.h"

using namespace shardlm::cuda;

namespace {
constexpr int64_t P = kAttnPartition;
}

TEST(AttentionPartitions, PartitionSizeIsWholeRounds) {
  // The kernels stage rounds of 16 positions; a partition boundary must not cut one.
  EXPECT_EQ(P % 16, 0);
}

TEST(AttentionPartitions, FirstPosition) {
  EXPECT_EQ(attention_first_position(0, 0), 0);
  EXPECT_EQ(attention_first_position(1000, 0), 0);
  EXPECT_EQ(attention_first_position(1000, -3), 0);
  EXPECT_EQ(attention_first_position(1000, 1), 1000);
  EXPECT_EQ(attention_first_position(1000, 37), 964);
  EXPECT_EQ(attention_first_position(10, 37), 0);
  EXPECT_EQ(attention_first_position(36, 37), 0);
  EXPECT_EQ(attention_first_position(37, 37), 1);
}

TEST(AttentionPartitions, CountsWholeRangesCutAtMultiples) {
  EXPECT_EQ(attention_partitions(-1, 0), 0);  // padding
  EXPECT_EQ(attention_partitions(-1, 37), 0);
  EXPECT_EQ(attention_partitions(0, 0), 1);
  EXPECT_EQ(attention_partitions(P - 1, 0), 1);
  EXPECT_EQ(attention_partitions(P, 0), 2);
  EXPECT_EQ(attention_partitions(3 * P - 1, 0), 3);
  EXPECT_EQ(attention_partitions(3 * P, 0), 4);
  // Sliding windows: the partitions between the first and the last attended position.
  EXPECT_EQ(attention_partitions(P + 10, 37), 2);     // [P - 26, P + 10] crosses the boundary
  EXPECT_EQ(attention_partitions(P + 36, 37), 1);     // [P, P + 36]
  EXPECT_EQ(attention_partitions(P + 35, 37), 2);     // [P - 1, P + 35]
  EXPECT_EQ(attention_partitions(10 * P - 1, P), 1);  // [9P, 10P - 1]: exactly one
  EXPECT_EQ(attention_partitions(10 * P, P), 2);      // [9P + 1, 10P]
  EXPECT_EQ(attention_partitions(2 * P + 5, 1), 1);   // the token alone
  // A count equals the partitions a loop over the attended positions meets.
  for (int64_t window : {0, 1, 37, 600, 3 * 512 + 1}) {
    for (int64_t pos = 0; pos < 4 * P; pos += 7) {
      int64_t seen = 0, last = -1;
      for (int64_t p = attention_first_position(pos, window); p <= pos; ++p) {
        if (p / P != last) ++seen;
        last = p / P;
      }
      ASSERT_EQ(attention_partitions(pos, window), seen) << "pos " << pos << " window " << window;
    }
  }
}

TEST(AttentionPartitions, MaxPartitionsBoundsEveryPositionUpToIt) {
  // The bound a captured step's grid is sized by: the most any position 0..max_pos has, exactly.
  for (int64_t window : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{37}, P - 1, P, P + 1, int64_t{600}, 3 * P + 1}) {
    int64_t most = 0;
    for (int64_t pos = 0; pos < 5 * P; ++pos) {
      most = std::max(most, attention_partitions(pos, window));
      if (pos % 97 == 0 || pos == 5 * P - 1) {
        ASSERT_EQ(attention_max_partitions(pos, window), most) << "max_pos " << pos << " window " << window;
      }
    }
  }
  EXPECT_EQ(attention_max_partitions(-1, 0), 0);
}

TEST(AttentionPartitions, SplitsOnlyAShortGridWithLongContexts) {
  const int64_t sms = 132, budget = 1 << 20;
  EXPECT_EQ(attention_split_parts(4, sms, 1, 0, budget), 1);     // one partition: nothing to split
  EXPECT_EQ(attention_split_parts(4, sms, 0, 0, budget), 1);     // padding only
  EXPECT_EQ(attention_split_parts(4, sms, 8, 1000, budget), 8);  // batch-1 decode, long context
  EXPECT_EQ(attention_split_parts(kSplitBelowBlocksPerSm * sms - 1, sms, 8, 1000, budget), 8);
  EXPECT_EQ(attention_split_parts(kSplitBelowBlocksPerSm * sms, sms, 8, 1000, budget), 1);  // device full
  EXPECT_EQ(attention_split_parts(4, sms, 8, budget + 1, budget), 1);                       // states over the budget
  EXPECT_EQ(attention_split_parts(4, 0, 8, 1000, budget), 1);                               // unknown device
  EXPECT_EQ(attention_split_parts(1, sms, kMaxGridY, 1000, budget), kMaxGridY);
  EXPECT_EQ(attention_split_parts(1, sms, kMaxGridY + 1, 1000, budget), 1);  // past the grid's y extent
}

TEST(AttentionPartitions, StateSize) {
  // (m, l) and the accumulators per (token, head, partition).
  EXPECT_EQ(attention_split_floats(3, 16, 512, 4), 3 * 16 * 4 * 514);
  EXPECT_EQ(attention_split_floats(0, 16, 512, 4), 0);
}
