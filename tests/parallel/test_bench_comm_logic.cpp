// shardlm bench-comm without MPI: size parsing, nccl-tests bus factors, and the input / expected
// values (checked against a direct simulation of each operation over n ranks).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cli/bench_comm.h"
#include "core/error.h"

using namespace shardlm;
using namespace shardlm::bench_comm;

TEST(BenchCommParseSize, Suffixes) {
  EXPECT_EQ(parse_size("0", "--min-bytes"), 0u);
  EXPECT_EQ(parse_size("8", "--min-bytes"), 8u);
  EXPECT_EQ(parse_size("64K", "--x"), 65536u);
  EXPECT_EQ(parse_size("64k", "--x"), 65536u);
  EXPECT_EQ(parse_size("64M", "--max-bytes"), 64ull * 1048576ull);
  EXPECT_EQ(parse_size("3G", "--x"), 3ull << 30);
  EXPECT_EQ(parse_size("1000", "--x"), 1000u);
}

TEST(BenchCommParseSize, RejectsGarbageNamingTheOption) {
  for (const char* bad : {"", "M", "-8", "+8", "1.5M", "12Q", "8MB", "8 M", " 8", "99999999999999999999", "17179869184G"}) {
    try {
      parse_size(bad, "--max-bytes");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--max-bytes"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(BenchCommOps, Parse) {
  EXPECT_EQ(parse_ops("all").size(), 5u);
  std::vector<Op> two = parse_ops("all_gather,sendrecv");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], Op::kAllGather);
  EXPECT_EQ(two[1], Op::kSendRecv);
  EXPECT_THROW(parse_ops("allreduce"), Error);
  EXPECT_THROW(parse_ops("all_reduce,"), Error);
  EXPECT_STREQ(nccl_tests_binary(Op::kAllReduce), "all_reduce_perf");
}

TEST(BenchCommBusFactor, NcclTestsFactors) {
  EXPECT_DOUBLE_EQ(bus_factor(Op::kAllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kAllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kReduceScatter, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kAllToAll, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kSendRecv, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Op::kSendRecv, 7), 1.0);
}

TEST(BenchCommSizes, BlocksFollowNcclTests) {
  // 64 MiB of float on 4 ranks: all_reduce 16Mi elements; all_gather blocks of 4Mi.
  EXPECT_EQ(block_count(Op::kAllReduce, 4, 64 << 20, 4), 16u << 20);
  EXPECT_EQ(block_count(Op::kAllGather, 4, 64 << 20, 4), 4u << 20);
  EXPECT_EQ(block_count(Op::kAllToAll, 3, 100, 4), 8u);  // rounded down
  EXPECT_EQ(size_bytes(Op::kAllToAll, 3, 8, 4), 96u);
  EXPECT_EQ(block_count(Op::kReduceScatter, 3, 8, 4), 0u);
  EXPECT_EQ(send_elems(Op::kReduceScatter, 3, 5), 15u);
  EXPECT_EQ(recv_elems(Op::kReduceScatter, 3, 5), 5u);
  EXPECT_EQ(send_elems(Op::kAllGather, 3, 5), 5u);
  EXPECT_EQ(recv_elems(Op::kAllGather, 3, 5), 15u);
  EXPECT_EQ(send_elems(Op::kSendRecv, 3, 5), 5u);
}

TEST(BenchCommValues, SmallIntegersDependingOnRankAndIndex) {
  int differ_rank = 0, differ_index = 0;
  for (int r = 0; r < 8; ++r) {
    for (uint64_t i = 0; i < 1000; ++i) {
      const int v = input_value(r, i);
      ASSERT_GE(v, -8);
      ASSERT_LE(v, 8);
      differ_rank += v != input_value(r + 1, i);
      differ_index += v != input_value(r, i + 1);
    }
  }
  EXPECT_GT(differ_rank, 7000);  // almost every element tells the ranks apart
  EXPECT_GT(differ_index, 7000);
  // Huge indices keep every bit (values worked out in Python: a 32-bit index would give -7).
  EXPECT_EQ(input_value(3, (uint64_t{1} << 40) + 12345), -3);
  EXPECT_EQ(input_value(3, (uint64_t{1} << 63) + 5), -3);
  // A fixed value, so the sequence cannot drift silently between versions.
  EXPECT_EQ(input_value(0, 0), static_cast<int>(11 % 17) - 8);
}

// Simulates each operation on n ranks from input_value and compares with expected_value.
TEST(BenchCommValues, ExpectedMatchesSimulatedOperation) {
  for (int n : {1, 2, 3, 4}) {
    for (uint64_t block : {0u, 1u, 5u}) {
      auto in = [&](Op op, int r) {
        std::vector<int64_t> v(send_elems(op, n, block));
        for (uint64_t i = 0; i < v.size(); ++i) v[i] = input_value(r, i);
        return v;
      };
      for (int r = 0; r < n; ++r) {
        std::vector<int64_t> ar(block, 0), ag, rs(block, 0), a2a, sr;
        for (int q = 0; q < n; ++q) {
          std::vector<int64_t> x = in(Op::kAllReduce, q);
          for (uint64_t i = 0; i < block; ++i) ar[i] += x[i];
          x = in(Op::kAllGather, q);
          ag.insert(ag.end(), x.begin(), x.end());
          x = in(Op::kReduceScatter, q);
          for (uint64_t i = 0; i < block; ++i) rs[i] += x[r * block + i];
          x = in(Op::kAllToAll, q);
          a2a.insert(a2a.end(), x.begin() + r * block, x.begin() + (r + 1) * block);
        }
        sr = in(Op::kSendRecv, (r + n - 1) % n);
        const std::vector<std::pair<Op, std::vector<int64_t>*>> cases = {
            {Op::kAllReduce, &ar}, {Op::kAllGather, &ag}, {Op::kReduceScatter, &rs}, {Op::kAllToAll, &a2a}, {Op::kSendRecv, &sr}};
        for (auto& [op, want] : cases) {
          ASSERT_EQ(want->size(), recv_elems(op, n, block)) << op_name(op);
          for (uint64_t i = 0; i < want->size(); ++i)
            ASSERT_EQ(expected_value(op, n, r, block, i), (*want)[i]) << op_name(op) << " n=" << n << " r=" << r << " i=" << i;
        }
      }
    }
  }
  // Spot values: the all_reduce of 2 ranks is the sum of both inputs.
  EXPECT_EQ(expected_value(Op::kAllReduce, 2, 1, 10, 3), input_value(0, 3) + input_value(1, 3));
  EXPECT_EQ(expected_value(Op::kSendRecv, 4, 0, 10, 3), input_value(3, 3));
  EXPECT_EQ(expected_value(Op::kAllToAll, 3, 2, 4, 5), input_value(1, 2 * 4 + 1));
}
