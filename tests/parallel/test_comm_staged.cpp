// StagedCommunicator (device buffers staged through host memory for MPI), run as an MPI job on 2
// and 3 ranks with "device" buffers from a fake arena (tests/parallel/fake_device_memory.h): every
// operation must give exactly what the plain MPI communicator gives on host buffers, write only
// the elements the operation defines, copy irecv data out only in wait(), and reuse and return its
// staging memory.
//
// Control flow stays collective: EXPECT_* only, so that a failing rank keeps taking part.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm_checks.h"
#include "fake_device_memory.h"
#include "parallel/comm_mpi.h"
#include "parallel/comm_staged.h"
#include "parallel/mpi_env.h"

using namespace shardlm;
using shardlm::testing_support::FakeDeviceMemory;

namespace {

constexpr double kTimeout = 60;
const size_t kCounts[] = {0, 1, 7, 1000};

// Small values (u8 sums over 3 ranks fit) that depend on the rank and the index.
template <typename T>
std::vector<T> pattern(int rank, size_t n, int salt = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>((static_cast<size_t>(rank) * 7 + i * 3 + i / 13 + salt) % 29);
  return v;
}

std::vector<int> world_members() {
  std::vector<int> m(static_cast<size_t>(MpiEnv::size()));
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<int>(i);
  return m;
}

class Staged : public ::testing::Test {
 protected:
  Staged()
      : mem_(std::make_shared<FakeDeviceMemory>(64 << 20)),
        ref_(world_members(), "world", kTimeout),
        st_(std::make_unique<MpiCommunicator>(world_members(), "staged world", kTimeout), mem_) {}

  // A device copy of host data (written directly: the arena is host memory underneath, and the
  // copy counters stay those of the communicator).
  template <typename T>
  T* dev(const std::vector<T>& h) {
    T* d = mem_->alloc_device_array<T>(h.size() + 1);
    if (!h.empty()) std::memcpy(d, h.data(), h.size() * sizeof(T));
    return d;
  }
  template <typename T>
  std::vector<T> host(const T* d, size_t n) {
    std::vector<T> h(n);
    if (n > 0) std::memcpy(h.data(), d, n * sizeof(T));
    return h;
  }
  int n() const { return ref_.size(); }
  int r() const { return ref_.rank(); }
  std::string where(const char* op, size_t count) const {
    return std::string(op) + " count " + std::to_string(count) + " on world rank " + std::to_string(MpiEnv::rank());
  }

  std::shared_ptr<FakeDeviceMemory> mem_;
  MpiCommunicator ref_;
  StagedCommunicator st_;
};

TEST_F(Staged, AllReduce) {
  for (size_t count : kCounts) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      std::vector<int32_t> want = pattern<int32_t>(r(), count);
      int32_t* d = dev(want);
      ref_.all_reduce(want.data(), count, CommDType::kI32, op);
      st_.all_reduce(d, count, CommDType::kI32, op);
      EXPECT_EQ(host(d, count), want) << where("all_reduce", count);
    }
    std::vector<float> wantf = pattern<float>(r(), count, 5);
    float* df = dev(wantf);
    ref_.all_reduce(wantf.data(), count, CommDType::kF32, ReduceOp::kSum);
    st_.all_reduce(df, count, CommDType::kF32, ReduceOp::kSum);
    EXPECT_EQ(host(df, count), wantf) << where("all_reduce f32", count);
  }
}

TEST_F(Staged, AllGatherIncludingInPlaceAndMixed) {
  for (size_t count : kCounts) {
    const size_t total = count * static_cast<size_t>(n());
    std::vector<int64_t> send = pattern<int64_t>(r(), count), want(total);
    ref_.all_gather(send.data(), want.data(), count, CommDType::kI64);

    int64_t* ds = dev(send);
    int64_t* dr = dev(std::vector<int64_t>(total, -1));
    st_.all_gather(ds, dr, count, CommDType::kI64);
    EXPECT_EQ(host(dr, total), want) << where("all_gather", count);

    // In place: the send block is this rank's block of the receive buffer.
    std::vector<int64_t> in_place(total, -1);
    std::copy(send.begin(), send.end(), in_place.begin() + static_cast<long>(static_cast<size_t>(r()) * count));
    int64_t* dip = dev(in_place);
    st_.all_gather(dip + static_cast<size_t>(r()) * count, dip, count, CommDType::kI64);
    EXPECT_EQ(host(dip, total), want) << where("all_gather in place", count);

    // Host send, device receive.
    int64_t* dm = dev(std::vector<int64_t>(total, -1));
    st_.all_gather(send.data(), dm, count, CommDType::kI64);
    EXPECT_EQ(host(dm, total), want) << where("all_gather host->device", count);
  }
}

TEST_F(Staged, ReduceScatter) {
  for (size_t count : kCounts) {
    const size_t total = count * static_cast<size_t>(n());
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<uint8_t> send = pattern<uint8_t>(r(), total), want(count);
      ref_.reduce_scatter(send.data(), want.data(), count, CommDType::kU8, op);
      uint8_t* ds = dev(send);
      uint8_t* dr = dev(std::vector<uint8_t>(count, 0xee));
      st_.reduce_scatter(ds, dr, count, CommDType::kU8, op);
      EXPECT_EQ(host(dr, count), want) << where("reduce_scatter", count);
    }
  }
}

TEST_F(Staged, AllToAll) {
  for (size_t count : kCounts) {
    const size_t total = count * static_cast<size_t>(n());
    std::vector<int32_t> send = pattern<int32_t>(r(), total), want(total);
    ref_.all_to_all(send.data(), want.data(), count, CommDType::kI32);
    int32_t* ds = dev(send);
    int32_t* dr = dev(std::vector<int32_t>(total, -1));
    st_.all_to_all(ds, dr, count, CommDType::kI32);
    EXPECT_EQ(host(dr, total), want) << where("all_to_all", count);
  }
}

TEST_F(Staged, AllToAllvLeavesGapsUntouched) {
  for (size_t scale : {size_t{0}, size_t{1}, size_t{40}}) {
    const size_t nr = static_cast<size_t>(n());
    // Rank a sends (a + 2 b + 1) * scale elements to rank b (zero for some pairs when scale is 0);
    // blocks are placed with a gap of 3 elements between them.
    auto cnt = [&](size_t a, size_t b) { return (a + 2 * b + 1) % 4 * scale; };
    std::vector<size_t> sc(nr), sd(nr), rc(nr), rd(nr);
    size_t s_end = 0, r_end = 0;
    for (size_t p = 0; p < nr; ++p) {
      sc[p] = cnt(static_cast<size_t>(r()), p);
      sd[p] = s_end + 3;
      s_end = sd[p] + sc[p];
      rc[p] = cnt(p, static_cast<size_t>(r()));
      rd[p] = r_end + 3;
      r_end = rd[p] + rc[p];
    }
    std::vector<float> send = pattern<float>(r(), s_end), want(r_end, -7.0f);
    ref_.all_to_allv(send.data(), sc, sd, want.data(), rc, rd, CommDType::kF32);
    float* ds = dev(send);
    float* dr = dev(std::vector<float>(r_end, -7.0f));
    st_.all_to_allv(ds, sc, sd, dr, rc, rd, CommDType::kF32);
    EXPECT_EQ(host(dr, r_end), want) << where("all_to_allv", scale);
  }
}

TEST_F(Staged, BroadcastFromEveryRoot) {
  for (size_t count : kCounts) {
    for (int root = 0; root < n(); ++root) {
      std::vector<int32_t> want = pattern<int32_t>(r(), count, root);
      int32_t* d = dev(want);
      ref_.broadcast(want.data(), count, CommDType::kI32, root);
      st_.broadcast(d, count, CommDType::kI32, root);
      EXPECT_EQ(host(d, count), want) << where("broadcast", count) << " root " << root;
    }
  }
}

TEST_F(Staged, SendRecvRing) {
  for (size_t count : kCounts) {
    const int next = (r() + 1) % n(), prev = (r() + n() - 1) % n();
    std::vector<int64_t> send = pattern<int64_t>(r(), count), want(count, -1);
    ref_.send_recv(send.data(), count, next, want.data(), count, prev, CommDType::kI64, 3);
    int64_t* ds = dev(send);
    int64_t* dr = dev(std::vector<int64_t>(count, -1));
    st_.send_recv(ds, count, next, dr, count, prev, CommDType::kI64, 3);
    EXPECT_EQ(host(dr, count), want) << where("send_recv", count);
    EXPECT_EQ(want, pattern<int64_t>(prev, count)) << where("send_recv reference", count);
  }
}

TEST_F(Staged, BlockingSendRecvAroundTheRing) {
  for (size_t count : kCounts) {
    const int next = (r() + 1) % n(), prev = (r() + n() - 1) % n();
    std::vector<int32_t> send = pattern<int32_t>(r(), count, 1);
    int32_t* ds = dev(send);
    int32_t* dr = dev(std::vector<int32_t>(count, -1));
    // Rank 0 sends first, the others receive first: the message travels once around the ring.
    if (r() == 0) {
      st_.send(ds, count, CommDType::kI32, next, 9);
      st_.recv(dr, count, CommDType::kI32, prev, 9);
    } else {
      st_.recv(dr, count, CommDType::kI32, prev, 9);
      st_.send(ds, count, CommDType::kI32, next, 9);
    }
    EXPECT_EQ(host(dr, count), pattern<int32_t>(prev, count, 1)) << where("send/recv", count);
  }
}

TEST_F(Staged, NonblockingCopiesOutOnWait) {
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
    const int next = (r() + 1) % n(), prev = (r() + n() - 1) % n();
    std::vector<int32_t> send = pattern<int32_t>(r(), count, 2);
    int32_t* ds = dev(send);
    int32_t* dr = dev(std::vector<int32_t>(count, -1));
    auto rq = st_.irecv(dr, count, CommDType::kI32, prev, 4);
    const uint64_t staged_before = mem_->to_host_calls;
    auto sq = st_.isend(ds, count, CommDType::kI32, next, 4);
    EXPECT_EQ(mem_->to_host_calls, staged_before + 1) << where("isend stages at the call", count);
    // The device buffer may change once isend returns: what arrives is what it held at the call.
    // (The fake device memory is host memory.)
    std::fill(ds, ds + count, 0);
    sq->wait();
    ref_.barrier();  // every send has completed, so the message sits in the staging buffer
    EXPECT_EQ(host(dr, count), std::vector<int32_t>(count, -1)) << where("irecv before wait", count);
    rq->wait();
    EXPECT_EQ(host(dr, count), pattern<int32_t>(prev, count, 2)) << where("irecv after wait", count);
    rq->wait();  // a second wait is a no-op
  }
}

// The wait of a request counts in the staged communicator's seconds, for host buffers (passed
// through) and for device buffers (staged), as in the inner communicator's.
TEST_F(Staged, WaitsAreCounted) {
  comm_checks::check_waits_are_counted(st_);
  if (n() < 2) return;
  int32_t* d = dev(std::vector<int32_t>{r() == 0 ? 9 : 0});
  const double before = st_.stats().seconds;
  if (r() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    st_.isend(d, 1, CommDType::kI32, 1, 7)->wait();
  } else if (r() == 1) {
    st_.irecv(d, 1, CommDType::kI32, 0, 7)->wait();
    EXPECT_EQ(host(d, 1)[0], 9);
    EXPECT_GE(st_.stats().seconds - before, 0.24);
  }
  st_.barrier();
}

// The staging copies are the call's time too: a copy from the device waits for the kernels queued
// before it, as a device communicator's call does. Each copy takes 0.1 s here, and an all-reduce
// of a device buffer copies in and out.
TEST_F(Staged, StagingCopiesCountAsTheCallsTime) {
  int32_t* d = dev(std::vector<int32_t>(8, r()));
  const double before = st_.stats().seconds;
  mem_->copy_delay_s = 0.1;
  st_.all_reduce(d, 8, CommDType::kI32, ReduceOp::kSum);
  mem_->copy_delay_s = 0;
  EXPECT_EQ(host(d, 8)[7], n() * (n() - 1) / 2);
  EXPECT_GE(st_.stats().seconds - before, 0.18);
}

TEST_F(Staged, HostBuffersPassThroughAndStagingIsReused) {
  const uint64_t copies_before = mem_->to_host_calls + mem_->to_device_calls;
  std::vector<int32_t> h = pattern<int32_t>(r(), 100), want = h;
  st_.all_reduce(h.data(), h.size(), CommDType::kI32, ReduceOp::kSum);
  ref_.all_reduce(want.data(), want.size(), CommDType::kI32, ReduceOp::kSum);
  EXPECT_EQ(h, want);
  EXPECT_EQ(mem_->to_host_calls + mem_->to_device_calls, copies_before) << "host buffers must not be staged";

  const uint64_t allocs_before = mem_->staging_allocs, in_before = mem_->to_host_calls, out_before = mem_->to_device_calls;
  for (int i = 0; i < 20; ++i) {
    int32_t* d = dev(pattern<int32_t>(r(), 500));
    st_.all_reduce(d, 500, CommDType::kI32, ReduceOp::kSum);
  }
  EXPECT_LE(mem_->staging_allocs - allocs_before, 1u) << "staging buffers must be reused";
  EXPECT_EQ(mem_->to_host_calls - in_before, 20u) << "one copy in per device all_reduce";
  EXPECT_EQ(mem_->to_device_calls - out_before, 20u) << "one copy out per device all_reduce";
  // Sizes that grow from step to step (a tp all-reduce of T x H) reuse power-of-two buffers
  // instead of pinning one more for each new largest size: 64 sizes, 7 buffers.
  const uint64_t grow_before = mem_->staging_allocs;
  for (int i = 1; i <= 64; ++i) {
    const size_t n = 1000 * static_cast<size_t>(i);
    int32_t* d = dev(pattern<int32_t>(r(), n));
    st_.all_reduce(d, n, CommDType::kI32, ReduceOp::kSum);
  }
  EXPECT_LE(mem_->staging_allocs - grow_before, 7u);
  EXPECT_EQ(st_.stats().calls, st_.inner().stats().calls);
  EXPECT_EQ(st_.stats().bytes_sent, st_.inner().stats().bytes_sent);
  EXPECT_EQ(st_.size(), ref_.size());
  EXPECT_EQ(st_.name(), "staged world");
}

TEST(StagedLifetime, StagingMemoryReturnedOnDestruction) {
  auto mem = std::make_shared<FakeDeviceMemory>(1 << 20);
  {
    StagedCommunicator st(std::make_unique<MpiCommunicator>(world_members(), "staged", kTimeout), mem);
    int32_t* d = mem->alloc_device_array<int32_t>(64);
    for (int i = 0; i < 64; ++i) d[i] = i;
    st.all_reduce(d, 64, CommDType::kI32, ReduceOp::kMax);
    std::vector<int32_t> got(d, d + 64);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], i);
    EXPECT_GE(mem->staging_live(), 1u);
  }
  EXPECT_EQ(mem->staging_live(), 0u);
}

}  // namespace
