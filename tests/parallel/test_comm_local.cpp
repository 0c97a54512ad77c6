// The communicator without an MPI job: the one-rank group (copies, no MPI calls), argument
// errors, the backend table and the group-creation tag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm_mpi.h"
#include "parallel/communicator.h"

using namespace shardlm;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(CommRegistry, BackendsAndSizes) {
  std::vector<std::string> names{"mpi"};
#ifdef SHARDLM_HAVE_LIBFABRIC
  names.push_back("fabric");
#endif
#ifdef SHARDLM_HAVE_NCCL
  names.push_back("nccl");
#endif
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  EXPECT_EQ(comm_backend_names(), names);
  EXPECT_EQ(comm_dtype_size(CommDType::kF32), 4u);
  EXPECT_EQ(comm_dtype_size(CommDType::kI32), 4u);
  EXPECT_EQ(comm_dtype_size(CommDType::kI64), 8u);
  EXPECT_EQ(comm_dtype_size(CommDType::kU8), 1u);
  EXPECT_EQ(comm_dtype_size(CommDType::kBF16), 2u);
  const std::string msg = error_of([] { make_communicator("nccl2", {0}, "x", 1); });
  EXPECT_NE(msg.find("unknown communicator backend 'nccl2' (known: " + known + ")"), std::string::npos) << msg;
}

TEST(CommLocal, MemberListErrors) {
  EXPECT_NE(error_of([] { make_communicator("mpi", {}, "g", 1); }).find("empty member list"), std::string::npos);
  EXPECT_NE(error_of([] { make_communicator("mpi", {0, 0}, "g", 1); }).find("world rank 0 listed twice"), std::string::npos);
  // Without an MPI job the world is this one rank.
  EXPECT_NE(error_of([] { make_communicator("mpi", {0, 1}, "g", 1); }).find("members must be world ranks in [0, 1)"),
            std::string::npos);
}

TEST(CommLocal, OneRankGroupCopies) {
  auto c = make_communicator("mpi", {0}, "solo", 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->name(), "solo");
  EXPECT_EQ(c->world_rank_of(0), 0);
  EXPECT_THROW(c->world_rank_of(1), Error);

  std::vector<float> buf = {1.5f, -2.f, 3.f};
  c->all_reduce(buf.data(), buf.size(), CommDType::kF32, ReduceOp::kSum);
  EXPECT_EQ(buf, (std::vector<float>{1.5f, -2.f, 3.f}));

  std::vector<int32_t> src = {4, 5, 6, 7}, dst(4, -1);
  c->all_gather(src.data(), dst.data(), 4, CommDType::kI32);
  EXPECT_EQ(dst, src);
  std::fill(dst.begin(), dst.end(), -1);
  c->reduce_scatter(src.data(), dst.data(), 4, CommDType::kI32, ReduceOp::kMax);
  EXPECT_EQ(dst, src);
  std::fill(dst.begin(), dst.end(), -1);
  c->all_to_all(src.data(), dst.data(), 4, CommDType::kI32);
  EXPECT_EQ(dst, src);
  std::fill(dst.begin(), dst.end(), -1);
  c->all_to_allv(src.data(), {2}, {1}, dst.data(), {2}, {2}, CommDType::kI32);
  EXPECT_EQ(dst, (std::vector<int32_t>{-1, -1, 5, 6}));
  EXPECT_THROW(c->all_to_allv(src.data(), {2}, {0}, dst.data(), {3}, {0}, CommDType::kI32), Error);
  EXPECT_THROW(c->all_to_allv(src.data(), {2, 1}, {0, 0}, dst.data(), {2}, {0}, CommDType::kI32), Error);
  c->broadcast(src.data(), 4, CommDType::kI32, 0);
  EXPECT_EQ(src, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_THROW(c->broadcast(src.data(), 4, CommDType::kI32, 1), Error);
  c->barrier();

  // Nothing to send to: the only peer would be this rank.
  const std::string msg = error_of([&] { c->send(src.data(), 1, CommDType::kI32, 0, 0); });
  EXPECT_NE(msg.find("send on group solo: peer 0 is this rank"), std::string::npos) << msg;
  EXPECT_THROW(c->recv(dst.data(), 1, CommDType::kI32, 0, 0), Error);
  EXPECT_THROW(c->send_recv(src.data(), 1, 0, dst.data(), 1, 0, CommDType::kI32, 0), Error);

  // 7 calls returned normally (the ones that threw are not counted); a group of one sends no bytes.
  EXPECT_EQ(c->stats().calls, 7u);
  EXPECT_EQ(c->stats().bytes_sent, 0u);
  EXPECT_GE(c->stats().seconds, 0.0);
}

TEST(CommLocal, GroupTag) {
  const int ub = 32767;
  const std::vector<int> a = {0, 2, 4, 6}, a_perm = {6, 4, 2, 0}, b = {1, 3, 5, 7};
  EXPECT_EQ(MpiCommunicator::group_tag(a, ub), MpiCommunicator::group_tag(a_perm, ub));
  EXPECT_NE(MpiCommunicator::group_tag(a, ub), MpiCommunicator::group_tag(b, ub));
  // Tags stay within [0, tag_ub] and differ between most of the pairs of an 8-rank world.
  std::vector<int> tags;
  for (int i = 0; i < 8; ++i)
    for (int j = i + 1; j < 8; ++j) {
      const int t = MpiCommunicator::group_tag({i, j}, ub);
      EXPECT_GE(t, 0);
      EXPECT_LE(t, ub);
      tags.push_back(t);
    }
  std::sort(tags.begin(), tags.end());
  EXPECT_GE(std::unique(tags.begin(), tags.end()) - tags.begin(), 26);
  EXPECT_LE(MpiCommunicator::group_tag({0, 1, 2}, 7), 7);
}
