// The MPI communicator in a real job (run with 2, 3 and 4 ranks): every operation on several sizes
// (0, odd counts, larger), int and float types, sum/max/min, on the world, on reordered and
// concurrently created disjoint sub-groups, and with a tiny per-call count limit that drives the
// >INT_MAX code paths (pieces, derived datatypes, alltoallw). Results are compared exactly, by the
// checks in comm_checks.h.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm_mpi.h"
#include "parallel/communicator.h"
#include "parallel/mpi_env.h"
#include "comm_checks.h"

using namespace shardlm;
using namespace shardlm::comm_checks;

TEST(CommMpi, WorldEveryOperation) {
  auto c = make_communicator("mpi", ranks_where([](int) { return true; }), "world", kTimeout);
  EXPECT_EQ(c->size(), world_size());
  EXPECT_EQ(c->rank(), world_rank());
  check_all_types(*c, {0, 1, 7, 64, 1001});
  check_everything<float>(*c, {100003});
}

// bf16 patterns are moved (check_all_types) but not reduced: MPI would add them as integers.
TEST(CommMpi, RefusesToReduceBf16) {
  auto c = make_communicator("mpi", ranks_where([](int) { return true; }), "world", kTimeout);
  if (c->size() < 2) GTEST_SKIP() << "a group of one reduces nothing";
  std::vector<uint16_t> v(4, 1), out(4);
  EXPECT_THROW(c->all_reduce(v.data(), v.size(), CommDType::kBF16, ReduceOp::kSum), Error);
  EXPECT_THROW(c->reduce_scatter(v.data(), out.data(), 1, CommDType::kBF16, ReduceOp::kSum), Error);
  c->barrier();  // nothing was left half sent
  check_moves<uint16_t>(*c, {3});
}

TEST(CommMpi, ReversedWorldRanksFollowMemberOrder) { check_reversed_world("mpi"); }

TEST(CommMpi, EvenAndOddGroupsCreatedConcurrently) { check_even_and_odd_groups("mpi"); }

TEST(CommMpi, TwoGroupsPerRankAndPairsCreatedConcurrently) {
  if (world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  check_two_groups_per_rank("mpi");
}

// max_count_per_call 7: every operation above 7 elements is split into pieces or carried by a
// derived datatype, the paths that multi-GiB buffers take with the real limit (INT_MAX).
TEST(CommMpi, CountsAboveThePerCallLimit) {
  auto c = make_communicator("mpi", ranks_where([](int) { return true; }), "world/limit7", kTimeout);
  static_cast<MpiCommunicator&>(*c).set_max_count_per_call(7);
  check_all_types(*c, {0, 6, 7, 8, 15, 50});
}

TEST(CommMpi, StatsCountBytesCallsAndTime) {
  auto c = make_communicator("mpi", ranks_where([](int) { return true; }), "stats", kTimeout);
  std::vector<float> buf(10, 1.f), out(10 * world_size());
  c->all_reduce(buf.data(), 10, CommDType::kF32, ReduceOp::kSum);
  EXPECT_EQ(buf[3], static_cast<float>(world_size()));
  c->all_gather(buf.data(), out.data(), 10, CommDType::kF32);
  c->barrier();
  EXPECT_EQ(c->stats().calls, 3u);
  EXPECT_EQ(c->stats().bytes_sent, 80u);  // 40 + 40 contributed, barrier none
  EXPECT_GT(c->stats().seconds, 0.0);
}

TEST(CommMpi, StatsCountTheWaitOfAReceive) {
  auto c = make_communicator("mpi", ranks_where([](int) { return true; }), "waits", kTimeout);
  check_waits_are_counted(*c);
}

TEST(CommMpi, ArgumentErrorsThrowWithoutCommunicating) {
  auto c = make_communicator("mpi", ranks_where([](int) { return true; }), "world", kTimeout);
  int32_t x = 0;
  EXPECT_THROW(c->send(&x, 1, CommDType::kI32, c->rank(), 0), Error);
  EXPECT_THROW(c->recv(&x, 1, CommDType::kI32, c->size(), 0), Error);
  EXPECT_THROW(c->broadcast(&x, 1, CommDType::kI32, -1), Error);
  EXPECT_THROW(c->all_to_allv(&x, {1}, {0}, &x, {1}, {0}, CommDType::kI32), Error);
  // A list without this rank fails before any MPI call.
  std::vector<int> others;
  for (int q = 0; q < world_size(); ++q)
    if (q != world_rank()) others.push_back(q);
  try {
    make_communicator("mpi", others, "others", kTimeout);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world rank " + std::to_string(world_rank()) + " is not a member"),
              std::string::npos)
        << e.what();
  }
  c->barrier();
}

// Real buffers above INT_MAX elements (uint8: 2 GiB + 3), opt-in because it needs about 4 GiB per
// rank: SHARDLM_TEST_BIG_COMM=1 mpiexec -np 2 test_comm_mpi --gtest_filter='*MultiGiB*'
TEST(CommMpi, MultiGiBBuffersWhenEnabled) {
  if (!std::getenv("SHARDLM_TEST_BIG_COMM")) GTEST_SKIP() << "set SHARDLM_TEST_BIG_COMM=1 (needs ~4 GiB per rank)";
  auto c = make_communicator("mpi", ranks_where([](int) { return true; }), "world/big", 600);
  const int n = c->size(), g = c->rank();
  const size_t count = (size_t{1} << 31) + 3;
  {
    std::vector<uint8_t> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<uint8_t>((i + g) % 7);
    c->all_reduce(buf.data(), count, CommDType::kU8, ReduceOp::kSum);
    expect_all(
        buf,
        [&](size_t i) {
          int64_t s = 0;
          for (int q = 0; q < n; ++q) s += static_cast<int64_t>((i + q) % 7);
          return s;
        },
        "big all_reduce");
    for (size_t i = 0; i < count; ++i) buf[i] = g == n - 1 ? static_cast<uint8_t>((i * 5 + 1) % 9) : 0;
    c->broadcast(buf.data(), count, CommDType::kU8, n - 1);
    expect_all(
        buf, [&](size_t i) { return static_cast<int64_t>((i * 5 + 1) % 9); }, "big broadcast");
    std::vector<uint8_t> got(count, 0);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<uint8_t>((i + 3 * g) % 13);
    c->send_recv(buf.data(), count, (g + 1) % n, got.data(), count, (g + n - 1) % n, CommDType::kU8, 1);
    expect_all(
        got, [&](size_t i) { return static_cast<int64_t>((i + 3 * ((g + n - 1) % n)) % 13); }, "big send_recv");
  }
  {
    std::vector<uint8_t> all(count * n, 0);
    for (size_t i = 0; i < count; ++i) all[count * g + i] = static_cast<uint8_t>((i * 3 + g) % 11);
    c->all_gather(all.data() + count * g, all.data(), count, CommDType::kU8);
    expect_all(
        all, [&](size_t i) { return static_cast<int64_t>(((i % count) * 3 + i / count) % 11); }, "big all_gather");
  }
  c->barrier();
}
