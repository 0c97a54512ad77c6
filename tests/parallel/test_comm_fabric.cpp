// The libfabric communicator in a real job (2, 3 and 4 ranks; CTest runs it on the tcp provider and
// on shm): every operation, type and reduction with exactly known results (comm_checks.h), on the
// world, reordered and concurrently created sub-groups, with a tiny message limit that splits
// everything into pieces; float reductions in rank order whatever the arrival order; a count the
// two sides disagree on fails the call with a message instead of hanging or corrupting.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm_checks.h"
#include "core/error.h"
#include "fake_device_memory.h"
#include "parallel/comm_fabric.h"
#include "parallel/comm_staged.h"
#include "parallel/communicator.h"
#include "parallel/mpi_env.h"

using namespace shardlm;
using namespace shardlm::comm_checks;

namespace {

std::vector<int> everyone() {
  return ranks_where([](int) { return true; });
}

std::unique_ptr<FabricCommunicator> make_fabric(const std::vector<int>& members, const std::string& name) {
  return std::make_unique<FabricCommunicator>(members, name, kTimeout);
}

}  // namespace

TEST(CommFabric, BackendIsRegistered) {
  const std::vector<std::string> names = comm_backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "fabric"), names.end());
  auto c = make_communicator("fabric", everyone(), "world", kTimeout);
  EXPECT_EQ(c->size(), world_size());
  EXPECT_EQ(c->rank(), world_rank());
  c->barrier();
}

TEST(CommFabric, EveryRankOpensTheProviderOfRankZero) {
  auto c = make_fabric(everyone(), "world");
  const std::string prov = c->provider();
  ASSERT_FALSE(prov.empty());
  if (const char* want = std::getenv("FI_PROVIDER")) {
    EXPECT_NE(prov.find(want), std::string::npos) << prov;
  } else {
    EXPECT_EQ(prov, "shm") << "a group on one node without FI_PROVIDER";
  }
  std::vector<uint8_t> mine(64, 0), all(64 * static_cast<size_t>(world_size()));
  std::memcpy(mine.data(), prov.data(), std::min<size_t>(prov.size(), 63));
  c->all_gather(mine.data(), all.data(), 64, CommDType::kU8);
  for (int r = 0; r < world_size(); ++r)
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(all.data() + 64 * r)), prov.substr(0, 63)) << "rank " << r;
  if (world_rank() == 0)
    std::printf("[fabric] provider %s, fabric %s, domain %s\n", prov.c_str(), c->fabric().c_str(), c->domain().c_str());
}

// bf16 patterns are moved (check_all_types) but not reduced; every rank refuses before sending.
TEST(CommFabric, RefusesToReduceBf16) {
  auto c = make_fabric(everyone(), "world");
  std::vector<uint16_t> v(4 * static_cast<size_t>(world_size()), 1), out(4);
  EXPECT_THROW(c->all_reduce(v.data(), 4, CommDType::kBF16, ReduceOp::kSum), Error);
  EXPECT_THROW(c->reduce_scatter(v.data(), out.data(), 4, CommDType::kBF16, ReduceOp::kSum), Error);
  check_moves<uint16_t>(*c, {3});
}

TEST(CommFabric, WorldEveryOperation) {
  auto c = make_fabric(everyone(), "world");
  check_all_types(*c, {0, 1, 7, 64, 1001});
  check_everything<float>(*c, {100003});
  // all_reduce in two phases at every size, and in one shot at every size.
  c->set_one_shot_bytes(0);
  check_all_types(*c, {1, 7, 1001});
  c->set_one_shot_bytes(size_t{1} << 30);
  check_everything<float>(*c, {100003});
}

TEST(CommFabric, ReversedWorldRanksFollowMemberOrder) { check_reversed_world("fabric"); }

TEST(CommFabric, EvenAndOddGroupsCreatedConcurrently) { check_even_and_odd_groups("fabric"); }

TEST(CommFabric, TwoGroupsPerRankAndPairsCreatedConcurrently) {
  if (world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  check_two_groups_per_rank("fabric");
}

// 7-byte pieces: every message above 7 bytes goes as several under one tag, in order.
TEST(CommFabric, MessagesAboveTheLimitGoInPieces) {
  auto c = make_fabric(everyone(), "world/limit7");
  c->set_max_message_bytes(7);
  check_all_types(*c, {0, 1, 2, 6, 7, 8, 15, 50});
}

// Every buffer registered with the provider (fi_mr_reg, its descriptor passed with the message),
// the path of a provider that insists on FI_MR_LOCAL; on odd ranks only, so that registered and
// unregistered peers meet too.
TEST(CommFabric, RegisteredBuffersWhereTheProviderAsks) {
  auto c = make_fabric(everyone(), "world/registered");
  if (c->rank() % 2 == 1 || c->size() == 2) c->register_every_buffer();
  check_all_types(*c, {0, 1, 64, 1001});
  c->set_max_message_bytes(7);
  check_everything<int32_t>(*c, {0, 9});
}

// Rank q contributes x_q with x_0 = 2^24 and the others 1 (or alternating signs): in float, (2^24 +
// 1) + 1 = 2^24 but 2^24 + (1 + 1) = 2^24 + 2, so only the rank-order sum gives the expected bits.
// Every rank must hold them, for all_reduce and reduce_scatter.
TEST(CommFabric, FloatSumsAreTakenInRankOrder) {
  if (world_size() < 3) GTEST_SKIP() << "needs 3 ranks for the order to matter";
  auto c = make_fabric(everyone(), "world/order");
  const int n = c->size(), g = c->rank();
  const size_t count = 37 * static_cast<size_t>(n);
  auto x = [](int q, size_t i) { return q == 0 ? 16777216.0f * (i % 2 ? -1.f : 1.f) : (i % 3 ? 1.f : 0.75f); };
  auto want = [&](size_t i) {
    float s = x(0, i);
    for (int q = 1; q < n; ++q) s += x(q, i);
    return s;
  };
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = x(g, i);
  c->all_reduce(buf.data(), count, CommDType::kF32, ReduceOp::kSum);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += buf[i] != want(i);
  EXPECT_EQ(bad, 0u) << "all_reduce";
  std::vector<float> send(count), recv(count / n);
  for (size_t i = 0; i < count; ++i) send[i] = x(g, i);
  c->reduce_scatter(send.data(), recv.data(), count / n, CommDType::kF32, ReduceOp::kSum);
  bad = 0;
  for (size_t i = 0; i < recv.size(); ++i) bad += recv[i] != want(g * (count / n) + i);
  EXPECT_EQ(bad, 0u) << "reduce_scatter";
  // The two-phase path (reduce-scatter + all-gather) gives the same bits as the one-shot one.
  c->set_one_shot_bytes(0);
  for (size_t i = 0; i < count; ++i) buf[i] = x(g, i);
  c->all_reduce(buf.data(), count, CommDType::kF32, ReduceOp::kSum);
  bad = 0;
  for (size_t i = 0; i < count; ++i) bad += buf[i] != want(i);
  EXPECT_EQ(bad, 0u) << "all_reduce in two phases";
  // And the case is a real one: some other order gives other bits.
  EXPECT_NE(x(0, 0) + (x(1, 0) + x(2, 0)), want(0));
}

// A message shorter than its receive: the length check fails the call naming the peer, and the
// communicator keeps working (no provider error was involved).
TEST(CommFabric, ShortMessageFailsNamingThePeer) {
  auto c = make_fabric(everyone(), "world/short");
  std::vector<int32_t> buf(8, 3);
  if (c->rank() == 0) {
    c->send(buf.data(), 4, CommDType::kI32, 1, 7);  // 16 bytes; rank 1 expects 20
  } else if (c->rank() == 1) {
    try {
      c->recv(buf.data(), 5, CommDType::kI32, 0, 7);
      ADD_FAILURE() << "a short message was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("received 16 bytes from world rank 0 (group rank 0), expected 20"),
                std::string::npos)
          << e.what();
    }
  }
  c->barrier();
  check_everything<int32_t>(*c, {5});
}

// A message longer than its receive: the provider's truncation error fails the call naming the
// peer. The communicator is not used again: after a failed call the job ends, and tcp;ofi_rxm was
// seen to lose a later message on the same connection after a truncation.
TEST(CommFabric, LongMessageFailsNamingThePeer) {
  {
    auto c = make_fabric(everyone(), "world/long");
    std::vector<int32_t> buf(8, 3);
    if (c->rank() == 0) {
      c->send(buf.data(), 6, CommDType::kI32, 1, 8);  // 24 bytes; rank 1 expects 20
    } else if (c->rank() == 1) {
      try {
        c->recv(buf.data(), 5, CommDType::kI32, 0, 8);
        ADD_FAILURE() << "a long message was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("recv on group world/long failed on world rank 1"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("receive from world rank 0 (group rank 0)"), std::string::npos)
            << e.what();
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank done with that communicator before the next test
}

TEST(CommFabric, NonblockingMessagesOverlap) {
  auto c = make_fabric(everyone(), "world/nb");
  const int n = c->size(), g = c->rank();
  // Every rank posts its receives from everyone first, then its sends, then waits: any order of
  // arrival must land each message in its own buffer (tags 0..2 per pair).
  std::vector<std::vector<int64_t>> in(static_cast<size_t>(n) * 3, std::vector<int64_t>(100, -1));
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n) * 3, std::vector<int64_t>(100));
  std::vector<std::unique_ptr<CommRequest>> reqs;
  for (int q = 0; q < n; ++q) {
    if (q == g) continue;
    for (int t = 0; t < 3; ++t) reqs.push_back(c->irecv(in[q * 3 + t].data(), 100, CommDType::kI64, q, t));
  }
  for (int q = 0; q < n; ++q) {
    if (q == g) continue;
    for (int t = 2; t >= 0; --t) {
      for (size_t i = 0; i < 100; ++i) out[q * 3 + t][i] = 1000000 * g + 1000 * t + static_cast<int64_t>(i) + 10 * q;
      reqs.push_back(c->isend(out[q * 3 + t].data(), 100, CommDType::kI64, q, t));
    }
  }
  for (auto& r : reqs) r->wait();
  for (int q = 0; q < n; ++q) {
    if (q == g) continue;
    for (int t = 0; t < 3; ++t)
      for (size_t i = 0; i < 100; ++i)
        EXPECT_EQ(in[q * 3 + t][i], 1000000 * q + 1000 * t + static_cast<int64_t>(i) + 10 * g) << q << " " << t;
  }
}

TEST(CommFabric, StatsCountBytesCallsAndTime) {
  auto c = make_fabric(everyone(), "stats");
  std::vector<float> buf(10, 1.f), out(10 * world_size());
  c->all_reduce(buf.data(), 10, CommDType::kF32, ReduceOp::kSum);
  EXPECT_EQ(buf[3], static_cast<float>(world_size()));
  c->all_gather(buf.data(), out.data(), 10, CommDType::kF32);
  c->barrier();
  EXPECT_EQ(c->stats().calls, 3u);
  EXPECT_EQ(c->stats().bytes_sent, 80u);
  EXPECT_GT(c->stats().seconds, 0.0);
}

TEST(CommFabric, StatsCountTheWaitOfAReceive) {
  auto c = make_fabric(everyone(), "waits");
  check_waits_are_counted(*c);
}

TEST(CommFabric, ArgumentErrorsThrowWithoutCommunicating) {
  auto c = make_fabric(everyone(), "world");
  int32_t x = 0;
  EXPECT_THROW(c->send(&x, 1, CommDType::kI32, c->rank(), 0), Error);
  EXPECT_THROW(c->recv(&x, 1, CommDType::kI32, c->size(), 0), Error);
  EXPECT_THROW(c->send(&x, 1, CommDType::kI32, (c->rank() + 1) % c->size(), -1), Error);
  EXPECT_THROW(c->broadcast(&x, 1, CommDType::kI32, -1), Error);
  EXPECT_THROW(c->all_to_allv(&x, {1}, {0}, &x, {1}, {0}, CommDType::kI32), Error);
  c->barrier();
}

// Device buffers (a fake arena) staged through host memory around the fabric communicator, as
// comm_registry does where there is a GPU.
TEST(CommFabric, DeviceBuffersStagedThroughHost) {
  auto mem = std::make_shared<testing_support::FakeDeviceMemory>(16 << 20);
  StagedCommunicator st(make_fabric(everyone(), "staged fabric"), mem);
  const int n = st.size(), g = st.rank();
  const size_t count = 1001;
  int32_t* d = mem->alloc_device_array<int32_t>(count);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<int32_t>(val(g, i));
  st.all_reduce(d, count, CommDType::kI32, ReduceOp::kSum);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    int64_t want = 0;
    for (int q = 0; q < n; ++q) want += val(q, i);
    bad += d[i] != want;
  }
  EXPECT_EQ(bad, 0u) << "staged all_reduce";
  int32_t* out = mem->alloc_device_array<int32_t>(count);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<int32_t>(val(g, i));
  st.send_recv(d, count, (g + 1) % n, out, count, (g + n - 1) % n, CommDType::kI32, 4);
  bad = 0;
  for (size_t i = 0; i < count; ++i) bad += out[i] != val((g + n - 1) % n, i);
  EXPECT_EQ(bad, 0u) << "staged send_recv";
  EXPECT_EQ(st.transport().rfind("libfabric ", 0), 0u) << st.transport();
}

TEST(CommFabric, TagsKeepTheirFields) {
  EXPECT_EQ(FabricCommunicator::p2p_tag(5, 3), (uint64_t{5} << 16) | 3);
  EXPECT_EQ(FabricCommunicator::p2p_tag(0x7fffffff, 0xffff) >> 63, 0u);
  const uint64_t t = FabricCommunicator::collective_tag(0x80000001u, 2, 7);
  EXPECT_EQ(t >> 63, 1u);
  EXPECT_EQ((t >> 24) & 0x7fffffff, 1u);  // the sequence number wraps at 2^31
  EXPECT_EQ((t >> 16) & 0xff, 2u);
  EXPECT_EQ(t & 0xffff, 7u);
  EXPECT_NE(FabricCommunicator::collective_tag(1, 0, 2), FabricCommunicator::collective_tag(1, 1, 2));
  EXPECT_NE(FabricCommunicator::collective_tag(1, 0, 2), FabricCommunicator::collective_tag(2, 0, 2));
}
