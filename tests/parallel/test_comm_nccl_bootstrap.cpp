// The NCCL communicator's GPU-free pieces, run as an MPI job (3 ranks): the unique-id exchange
// (only group rank 0 makes an id; every member gets its bytes, also in a reordered group), the
// wait-with-deadline loop (throws after the deadline naming the op, group and ranks; an async error
// aborts with the error text; success does not abort), the CommDType/ReduceOp mapping, and the
// clear refusal of `nccl` on a machine without a GPU.
//
// On a GPU machine (SHARDLM_REQUIRE_GPU) it also runs every operation on device buffers through a
// real NcclCommunicator and compares with exact expected values. NCCL refuses two ranks of one
// communicator on the same GPU ("Duplicate GPU detected"), so the group is the world when every
// rank has its own GPU and each rank alone otherwise (one GPU: collectives on one-rank
// communicators, point-to-point skipped); with one GPU a further test checks that two ranks on it
// fail with a clear error instead of hanging.
//
// Control flow stays collective: EXPECT_* only, so that a failing rank keeps taking part.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/gpu.h"
#include "core/error.h"
#include "parallel/comm_mpi.h"
#include "parallel/communicator.h"
#include "parallel/deadline_wait.h"
#include "parallel/mpi_env.h"
#include "parallel/unique_id_exchange.h"

#ifdef SHARDLM_HAVE_NCCL
#include <cuda_runtime.h>

#include "parallel/comm_nccl.h"
#include "parallel/gpu_binding.h"
#include "parallel/nccl_types.h"
#include "parallel/node_local.h"
#endif

using namespace shardlm;

namespace {

constexpr double kTimeout = 60;

std::vector<int> world_members() {
  std::vector<int> m(static_cast<size_t>(MpiEnv::size()));
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<int>(i);
  return m;
}

// What rank `world_rank` would produce: distinct bytes per rank.
UniqueIdBytes fake_id(int world_rank) {
  UniqueIdBytes b;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>((world_rank * 37 + static_cast<int>(i) * 11 + 1) & 0xff);
  return b;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(UniqueIdExchange, EveryRankGetsRootBytes) {
  MpiCommunicator world(world_members(), "world", kTimeout);
  int calls = 0;
  const UniqueIdBytes got = exchange_unique_id(world, [&]() {
    ++calls;
    return fake_id(MpiEnv::rank());
  });
  EXPECT_EQ(calls, world.rank() == 0 ? 1 : 0) << "only group rank 0 makes the id";
  EXPECT_EQ(got, fake_id(0)) << "world rank " << MpiEnv::rank();
}

TEST(UniqueIdExchange, ReorderedGroupUsesItsGroupRankZero) {
  std::vector<int> members = world_members();
  std::reverse(members.begin(), members.end());  // group rank 0 is the last world rank
  MpiCommunicator rev(members, "reversed", kTimeout);
  int calls = 0;
  const UniqueIdBytes got = exchange_unique_id(rev, [&]() {
    ++calls;
    return fake_id(MpiEnv::rank());
  });
  EXPECT_EQ(calls, MpiEnv::rank() == MpiEnv::size() - 1 ? 1 : 0);
  EXPECT_EQ(got, fake_id(MpiEnv::size() - 1)) << "world rank " << MpiEnv::rank();
}

WaitContext test_context(double timeout_s) {
  WaitContext c;
  c.op = "all_reduce";
  c.group = "tp(replica 0, stage 1)";
  c.rank = 2;
  c.world_rank = 5;
  c.host = "node-a";
  c.timeout_s = timeout_s;
  c.peers = "world ranks 4, 6";
  return c;
}

TEST(DeadlineWait, ThrowsAfterTheDeadlineNamingGroupAndRanks) {
  int aborts = 0, polls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = message_of([&] {
    wait_with_deadline(
        test_context(0.3),
        [&] {
          ++polls;
          return PollResult{PollState::kPending, ""};
        },
        [&] { ++aborts; });
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.3);
  EXPECT_LT(s, 10.0);
  EXPECT_GT(polls, 1);
  EXPECT_EQ(aborts, 1);
  EXPECT_NE(msg.find("all_reduce on group tp(replica 0, stage 1) timed out after 0.3 s on rank 2 (world rank 5, host "
                     "node-a); peers: world ranks 4, 6 (communicator aborted)"),
            std::string::npos)
      << msg;
}

TEST(DeadlineWait, AsyncErrorAbortsWithTheErrorText) {
  int aborts = 0, polls = 0;
  const std::string msg = message_of([&] {
    wait_with_deadline(
        test_context(30),
        [&] {
          if (++polls < 3) return PollResult{PollState::kPending, ""};
          return PollResult{PollState::kFailed, "remote process exited or there was a network error"};
        },
        [&] { ++aborts; });
  });
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(aborts, 1);
  EXPECT_NE(msg.find("all_reduce on group tp(replica 0, stage 1) failed on rank 2 (world rank 5, host node-a): remote "
                     "process exited or there was a network error"),
            std::string::npos)
      << msg;
}

TEST(DeadlineWait, DoneReturnsWithoutAbortEvenWithoutDeadline) {
  int aborts = 0, polls = 0;
  EXPECT_NO_THROW(wait_with_deadline(
      test_context(0),
      [&] { return PollResult{++polls < 50 ? PollState::kPending : PollState::kDone, ""}; },
      [&] { ++aborts; }));
  EXPECT_EQ(polls, 50);
  EXPECT_EQ(aborts, 0);
}

#ifdef SHARDLM_HAVE_NCCL
TEST(NcclTypes, MapEveryTypeAndOp) {
  EXPECT_EQ(nccl_dtype(CommDType::kF32), ncclFloat32);
  EXPECT_EQ(nccl_dtype(CommDType::kI32), ncclInt32);
  EXPECT_EQ(nccl_dtype(CommDType::kI64), ncclInt64);
  EXPECT_EQ(nccl_dtype(CommDType::kU8), ncclUint8);
  EXPECT_EQ(nccl_op(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(nccl_op(ReduceOp::kMax), ncclMax);
  EXPECT_EQ(nccl_op(ReduceOp::kMin), ncclMin);
  EXPECT_THROW(nccl_dtype(static_cast<CommDType>(99)), Error);
  EXPECT_THROW(nccl_op(static_cast<ReduceOp>(99)), Error);
  EXPECT_EQ(sizeof(ncclUniqueId), kUniqueIdBytes);
}
#endif

TEST(NcclBackend, RefusedClearlyWithoutGpu) {
#ifdef SHARDLM_HAVE_NCCL
  if (cuda::device_count() > 0) GTEST_SKIP() << "this host has a GPU";
  const std::string msg = message_of([] { make_communicator("nccl", world_members(), "tp(test)", kTimeout); });
  EXPECT_NE(msg.find("communicator backend nccl for group tp(test): no GPU on this host ("), std::string::npos) << msg;
#else
  const std::string msg = message_of([] { make_communicator("nccl", world_members(), "tp(test)", kTimeout); });
  EXPECT_NE(msg.find("unknown communicator backend 'nccl'"), std::string::npos) << msg;
#endif
}

#ifdef SHARDLM_HAVE_NCCL

void check_cuda(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Device buffer of n elements of T, freed at scope exit.
template <typename T>
struct DeviceVec {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceVec(size_t count) : n(count) { check_cuda(cudaMalloc(&p, (n > 0 ? n : 1) * sizeof(T))); }
  DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) { put(h); }
  ~DeviceVec() { cudaFree(p); }
  void put(const std::vector<T>& h) {
    if (!h.empty()) check_cuda(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n > 0) check_cuda(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Small non-negative integers depending on the rank and the index: sums are exact in float.
int64_t val(int g, size_t i) { return static_cast<int64_t>((static_cast<size_t>(g) * 5 + i * 3 + i / 11) % 13); }

template <typename T>
std::vector<T> vals(int g, size_t n, size_t offset = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(val(g, offset + i));
  return v;
}

// Every rank agrees whether all ranks have a GPU of their own on this node.
bool every_rank_has_own_gpu(const NodeLocal& nl) {
  int own = (nl.nodes == 1 && cuda::device_count() >= nl.local_size) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &own, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return own == 1;
}

TEST(NcclGpu, EveryOpOnDeviceBuffers) {
  SHARDLM_REQUIRE_GPU();
  const NodeLocal nl = node_local(60);
  const bool shared = !every_rank_has_own_gpu(nl);
  ASSERT_GE(bind_local_gpu(nl), 0);
  const std::vector<int> members = shared ? std::vector<int>{MpiEnv::rank()} : world_members();
  NcclCommunicator c(members, shared ? "alone(" + std::to_string(MpiEnv::rank()) + ")" : "world", kTimeout);
  const int n = c.size(), g = c.rank();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
    const std::string at = " count " + std::to_string(count) + " world rank " + std::to_string(MpiEnv::rank());
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {  // all_reduce
      DeviceVec<float> d(vals<float>(g, count));
      c.all_reduce(d.p, count, CommDType::kF32, op);
      const std::vector<float> got = d.get();
      for (size_t i = 0; i < count; ++i) {
        int64_t want = val(0, i);
        for (int q = 1; q < n; ++q)
          want = op == ReduceOp::kSum ? want + val(q, i) : op == ReduceOp::kMax ? std::max(want, val(q, i)) : std::min(want, val(q, i));
        EXPECT_EQ(got[i], static_cast<float>(want)) << "all_reduce" << at << " i " << i;
      }
    }
    {  // all_gather
      DeviceVec<int32_t> s(vals<int32_t>(g, count)), r(count * static_cast<size_t>(n));
      c.all_gather(s.p, r.p, count, CommDType::kI32);
      const std::vector<int32_t> got = r.get();
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(got[i], val(static_cast<int>(i / count), i % count)) << "all_gather" << at << " i " << i;
    }
    {  // reduce_scatter (sum)
      DeviceVec<int64_t> s(vals<int64_t>(g, count * static_cast<size_t>(n))), r(count);
      c.reduce_scatter(s.p, r.p, count, CommDType::kI64, ReduceOp::kSum);
      const std::vector<int64_t> got = r.get();
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int q = 0; q < n; ++q) want += val(q, static_cast<size_t>(g) * count + i);
        EXPECT_EQ(got[i], want) << "reduce_scatter" << at << " i " << i;
      }
    }
    {  // all_to_all: block b of the output is block g of rank b's input
      DeviceVec<uint8_t> s(vals<uint8_t>(g, count * static_cast<size_t>(n))), r(count * static_cast<size_t>(n));
      c.all_to_all(s.p, r.p, count, CommDType::kU8);
      const std::vector<uint8_t> got = r.get();
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(got[i], val(static_cast<int>(i / count), static_cast<size_t>(g) * count + i % count))
            << "all_to_all" << at << " i " << i;
    }
    {  // all_to_allv: rank a sends (a + b + 1) * count / 2 elements to rank b, packed
      auto cnt = [&](int a, int b) { return static_cast<size_t>(a + b + 1) * count / 2; };
      std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
      size_t s_total = 0, r_total = 0;
      for (int p = 0; p < n; ++p) {
        sc[p] = cnt(g, p), sd[p] = s_total, s_total += sc[p];
        rc[p] = cnt(p, g), rd[p] = r_total, r_total += rc[p];
      }
      DeviceVec<float> s(vals<float>(g, s_total)), r(r_total);
      c.all_to_allv(s.p, sc, sd, r.p, rc, rd, CommDType::kF32);
      const std::vector<float> got = r.get();
      for (int p = 0; p < n; ++p) {
        // Rank p's block for g starts at the sum of its counts to ranks before g.
        size_t off = 0;
        for (int b = 0; b < g; ++b) off += cnt(p, b);
        for (size_t i = 0; i < rc[p]; ++i)
          EXPECT_EQ(got[rd[p] + i], static_cast<float>(val(p, off + i))) << "all_to_allv" << at << " from " << p;
      }
    }
    for (int root = 0; root < n; ++root) {  // broadcast
      DeviceVec<int32_t> d(vals<int32_t>(g + 10 * root, count));
      c.broadcast(d.p, count, CommDType::kI32, root);
      EXPECT_EQ(d.get(), vals<int32_t>(root + 10 * root, count)) << "broadcast" << at << " root " << root;
    }
    if (n >= 2) {  // point to point on a ring
      const int next = (g + 1) % n, prev = (g + n - 1) % n;
      DeviceVec<int32_t> s(vals<int32_t>(g, count)), r(count);
      c.send_recv(s.p, count, next, r.p, count, prev, CommDType::kI32, 1);
      EXPECT_EQ(r.get(), vals<int32_t>(prev, count)) << "send_recv" << at;
      DeviceVec<int32_t> r2(count);
      if (g == 0) {
        c.send(s.p, count, CommDType::kI32, next, 2);
        c.recv(r2.p, count, CommDType::kI32, prev, 2);
      } else {
        c.recv(r2.p, count, CommDType::kI32, prev, 2);
        c.send(s.p, count, CommDType::kI32, next, 2);
      }
      EXPECT_EQ(r2.get(), vals<int32_t>(prev, count)) << "send/recv" << at;
      DeviceVec<int32_t> r3(count);
      // Outside a group NCCL's send and receive each block the stream until the peer's matching
      // call runs (NCCL's point-to-point documentation), so a ring where every rank sends first
      // may deadlock: rank 0 sends first and the others receive first, as with send/recv above.
      std::unique_ptr<CommRequest> sq, rq;
      if (g == 0) {
        sq = c.isend(s.p, count, CommDType::kI32, next, 3);
        rq = c.irecv(r3.p, count, CommDType::kI32, prev, 3);
      } else {
        rq = c.irecv(r3.p, count, CommDType::kI32, prev, 3);
        sq = c.isend(s.p, count, CommDType::kI32, next, 3);
      }
      sq->wait();
      rq->wait();
      EXPECT_EQ(r3.get(), vals<int32_t>(prev, count)) << "isend/irecv" << at;
    }
  }
  // Host buffers go over MPI; mixed buffers are refused before anything is sent.
  std::vector<int64_t> h(5, 1 + g);
  c.all_reduce(h.data(), h.size(), CommDType::kI64, ReduceOp::kSum);
  EXPECT_EQ(h, std::vector<int64_t>(5, static_cast<int64_t>(n) * (n + 1) / 2));
  DeviceVec<int32_t> d(4 * static_cast<size_t>(n));
  std::vector<int32_t> hs(4, g);
  const std::string msg = message_of([&] { c.all_gather(hs.data(), d.p, 4, CommDType::kI32); });
  EXPECT_NE(msg.find("the receive buffer is device memory but the send buffer is host memory"), std::string::npos) << msg;
  EXPECT_GT(c.stats().calls, 0u);
  c.barrier();
}

TEST(NcclGpu, TwoRanksOnOneGpuFailClearly) {
  SHARDLM_REQUIRE_GPU();
  const NodeLocal nl = node_local(60);
  int one_gpu = (nl.nodes == 1 && cuda::device_count() == 1 && MpiEnv::size() >= 2) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &one_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!one_gpu) GTEST_SKIP() << "needs two or more ranks sharing a single GPU";
  bind_local_gpu(nl);
  if (MpiEnv::rank() < 2) {
    // NCCL refuses a communicator with two ranks on one GPU; the init wait must turn that (or a
    // hang) into an Error naming the group, not a hung job.
    const std::string msg = message_of([] { NcclCommunicator c({0, 1}, "pair on one gpu", 30); });
    EXPECT_NE(msg.find("ncclCommInitRankConfig on group pair on one gpu"), std::string::npos) << msg;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

#ifdef SHARDLM_CUDA_EMULATION
// A device-side failure (here a receive shorter than its message, which the emulated NCCL turns
// into an async error, as NCCL reports a failed peer or network) ends the wait with an Error naming
// the operation, the group, the rank and the error, and aborts the communicator, which then refuses
// device calls. Emulated only: NCCL leaves mismatched counts undefined.
TEST(NcclGpu, AsyncErrorAbortsTheCommunicatorClearly) {
  SHARDLM_REQUIRE_GPU();
  const NodeLocal nl = node_local(60);
  if (MpiEnv::size() < 2 || !every_rank_has_own_gpu(nl)) GTEST_SKIP() << "needs two ranks with a GPU each";
  ASSERT_GE(bind_local_gpu(nl), 0);
  if (MpiEnv::rank() < 2) {
    NcclCommunicator c({0, 1}, "pair", kTimeout);
    DeviceVec<int32_t> s(vals<int32_t>(0, 8)), r(4);
    if (c.rank() == 0) {
      c.send(s.p, 8, CommDType::kI32, 1, 0);
    } else {
      const std::string msg = message_of([&] { c.recv(r.p, 4, CommDType::kI32, 0, 0); });
      EXPECT_NE(msg.find("recv on group pair failed on rank 1 (world rank 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unhandled system error (MPI: "), std::string::npos) << msg;
      EXPECT_NE(msg.find("(communicator aborted)"), std::string::npos) << msg;
      const std::string again = message_of([&] { c.all_reduce(r.p, 4, CommDType::kI32, ReduceOp::kSum); });
      EXPECT_NE(again.find("the NCCL communicator was aborted after an earlier error"), std::string::npos) << again;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
#endif  // SHARDLM_CUDA_EMULATION

#endif  // SHARDLM_HAVE_NCCL

}  // namespace
