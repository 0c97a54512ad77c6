// Checks of every Communicator operation with exactly known results (integers small enough that u8
// sums over 4 ranks fit, so float results are exact too): each rank checks what it received, counts
// the wrong elements and names the first. Shared by the MPI and libfabric communicator tests; run
// inside an MPI job (mpi_gtest_main.cpp).
//
// Control flow stays collective: checks use EXPECT_* (never ASSERT_*) so that a failing rank still
// takes part in the next operation.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/mpi_env.h"

namespace shardlm::comm_checks {

constexpr double kTimeout = 60;

inline int world_rank() { return MpiEnv::rank(); }
inline int world_size() { return MpiEnv::size(); }

// Small non-negative integers (u8 sums over 4 ranks fit), depending on the rank and the index.
inline int64_t val(int g, size_t i) { return static_cast<int64_t>((static_cast<size_t>(g) * 5 + i * 3 + i / 11) % 13); }

template <typename T>
CommDType dtype();
template <>
inline CommDType dtype<float>() {
  return CommDType::kF32;
}
template <>
inline CommDType dtype<int32_t>() {
  return CommDType::kI32;
}
template <>
inline CommDType dtype<int64_t>() {
  return CommDType::kI64;
}
template <>
inline CommDType dtype<uint8_t>() {
  return CommDType::kU8;
}
// 16-bit patterns stand for kBF16, which is moved but never reduced.
template <>
inline CommDType dtype<uint16_t>() {
  return CommDType::kBF16;
}

inline int64_t reduce(ReduceOp op, int64_t a, int64_t b) {
  return op == ReduceOp::kSum ? a + b : op == ReduceOp::kMax ? std::max(a, b) : std::min(a, b);
}

inline const char* op_text(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kMax ? "max" : "min"; }

// Counts elements of `got` different from want(i); reports the first.
template <typename T, typename F>
void expect_all(const std::vector<T>& got, F want, const std::string& what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != static_cast<T>(want(i))) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first wrong element " << first << " = " << +got[first] << ", expected "
                     << +static_cast<T>(want(first)) << " (world rank " << world_rank() << ")";
}

template <typename T>
void check_all_reduce(Communicator& c, size_t count, ReduceOp op) {
  const int n = c.size(), g = c.rank();
  std::vector<T> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(val(g, i));
  c.all_reduce(buf.data(), count, dtype<T>(), op);
  expect_all(
      buf,
      [&](size_t i) {
        int64_t s = val(0, i);
        for (int q = 1; q < n; ++q) s = reduce(op, s, val(q, i));
        return s;
      },
      c.name() + " all_reduce " + op_text(op) + " count " + std::to_string(count));
}

template <typename T>
void check_all_gather(Communicator& c, size_t count) {
  const int n = c.size(), g = c.rank();
  std::vector<T> send(count), recv(count * n + 1, T(99));
  for (size_t i = 0; i < count; ++i) send[i] = static_cast<T>(val(g, i));
  c.all_gather(send.data(), recv.data(), count, dtype<T>());
  expect_all(
      recv, [&](size_t i) { return i == count * n ? 99 : val(static_cast<int>(i / count), i % count); },
      c.name() + " all_gather count " + std::to_string(count));
  // In place: this rank's block already sits in the output.
  std::vector<T> inplace(count * n, T(0));
  std::copy(send.begin(), send.end(), inplace.begin() + count * g);
  c.all_gather(inplace.data() + count * g, inplace.data(), count, dtype<T>());
  expect_all(
      inplace, [&](size_t i) { return val(static_cast<int>(i / count), i % count); },
      c.name() + " all_gather in place count " + std::to_string(count));
}

template <typename T>
void check_reduce_scatter(Communicator& c, size_t count, ReduceOp op) {
  const int n = c.size(), g = c.rank();
  std::vector<T> send(count * n), recv(count + 1, T(99));
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<T>(val(g, i));
  c.reduce_scatter(send.data(), recv.data(), count, dtype<T>(), op);
  expect_all(
      recv,
      [&](size_t i) {
        if (i == count) return int64_t{99};
        int64_t s = val(0, g * count + i);
        for (int q = 1; q < n; ++q) s = reduce(op, s, val(q, g * count + i));
        return s;
      },
      c.name() + " reduce_scatter " + op_text(op) + " count " + std::to_string(count));
}

template <typename T>
void check_all_to_all(Communicator& c, size_t count) {
  const int n = c.size(), g = c.rank();
  std::vector<T> send(count * n), recv(count * n, T(99));
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<T>(val(g, i));
  c.all_to_all(send.data(), recv.data(), count, dtype<T>());
  expect_all(
      recv, [&](size_t i) { return val(static_cast<int>(i / count), g * count + i % count); },
      c.name() + " all_to_all count " + std::to_string(count));
}

// Rank s sends cnt(s, d) elements to d, val(s, 1000 d + k); blocks are laid out with gaps that must
// stay untouched.
template <typename T>
void check_all_to_allv(Communicator& c, size_t base) {
  const int n = c.size(), g = c.rank();
  auto cnt = [&](int s, int d) {
    return static_cast<size_t>((s * 3 + d * 5 + static_cast<int>(base)) % 7) * (base + 1) / 2;
  };
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t so = 1, ro = 2;
  for (int q = 0; q < n; ++q) {
    sc[q] = cnt(g, q);
    sd[q] = so;
    so += sc[q] + 2;
    rc[q] = cnt(q, g);
    rd[q] = ro;
    ro += rc[q] + 1;
  }
  std::vector<T> send(so, T(0)), recv(ro, T(99));
  for (int q = 0; q < n; ++q)
    for (size_t k = 0; k < sc[q]; ++k) send[sd[q] + k] = static_cast<T>(val(g, 1000 * q + k));
  c.all_to_allv(send.data(), sc, sd, recv.data(), rc, rd, dtype<T>());
  std::vector<int64_t> want(ro, 99);
  for (int q = 0; q < n; ++q)
    for (size_t k = 0; k < rc[q]; ++k) want[rd[q] + k] = val(q, 1000 * g + k);
  expect_all(
      recv, [&](size_t i) { return want[i]; }, c.name() + " all_to_allv base " + std::to_string(base));
}

template <typename T>
void check_broadcast(Communicator& c, size_t count) {
  for (int root = 0; root < c.size(); ++root) {
    std::vector<T> buf(count, T(99));
    if (c.rank() == root)
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(val(root, i));
    c.broadcast(buf.data(), count, dtype<T>(), root);
    expect_all(
        buf, [&](size_t i) { return val(root, i); },
        c.name() + " broadcast root " + std::to_string(root) + " count " + std::to_string(count));
  }
}

template <typename T>
void check_point_to_point(Communicator& c, size_t count) {
  const int n = c.size(), g = c.rank();
  if (n < 2) return;  // no peer to talk to
  // Ring: send to g+1, receive from g-1, at once.
  std::vector<T> send(count), recv(count, T(99));
  for (size_t i = 0; i < count; ++i) send[i] = static_cast<T>(val(g, i));
  c.send_recv(send.data(), count, (g + 1) % n, recv.data(), count, (g + n - 1) % n, dtype<T>(), 5);
  expect_all(
      recv, [&](size_t i) { return val((g + n - 1) % n, i); }, c.name() + " send_recv count " + std::to_string(count));
  // Pairs (0,1), (2,3), ...: even sends first, then the odd one answers with its own data.
  const int partner = g % 2 == 0 ? g + 1 : g - 1;
  if (partner < n) {
    std::fill(recv.begin(), recv.end(), T(99));
    if (g % 2 == 0) {
      c.send(send.data(), count, dtype<T>(), partner, 11);
      c.recv(recv.data(), count, dtype<T>(), partner, 12);
    } else {
      c.recv(recv.data(), count, dtype<T>(), partner, 11);
      c.send(send.data(), count, dtype<T>(), partner, 12);
    }
    expect_all(
        recv, [&](size_t i) { return val(partner, i); }, c.name() + " send/recv count " + std::to_string(count));
  }
}

// The operations that only move elements (a type that is never reduced: kBF16).
template <typename T>
void check_moves(Communicator& c, const std::vector<size_t>& counts) {
  for (size_t count : counts) {
    check_all_gather<T>(c, count);
    check_all_to_all<T>(c, count);
    check_all_to_allv<T>(c, count);
    check_broadcast<T>(c, count);
    check_point_to_point<T>(c, count);
  }
  c.barrier();
}

// Every operation: the reductions, then the moves.
template <typename T>
void check_everything(Communicator& c, const std::vector<size_t>& counts) {
  for (size_t count : counts) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      check_all_reduce<T>(c, count, op);
      check_reduce_scatter<T>(c, count, op);
    }
  }
  check_moves<T>(c, counts);
}

inline void check_all_types(Communicator& c, const std::vector<size_t>& counts) {
  check_everything<float>(c, counts);
  check_everything<int32_t>(c, counts);
  check_everything<int64_t>(c, counts);
  check_everything<uint8_t>(c, counts);
  check_moves<uint16_t>(c, counts);
}

inline std::vector<int> ranks_where(bool (*pred)(int)) {
  std::vector<int> r;
  for (int q = 0; q < world_size(); ++q)
    if (pred(q)) r.push_back(q);
  return r;
}

// Group construction on `backend`, shared by the communicator tests. A group of the world in
// reverse order: group ranks follow the member list.
inline void check_reversed_world(const std::string& backend) {
  std::vector<int> members = ranks_where([](int) { return true; });
  std::reverse(members.begin(), members.end());
  auto c = make_communicator(backend, members, "reversed", kTimeout);
  EXPECT_EQ(c->rank(), world_size() - 1 - world_rank());
  for (int r = 0; r < c->size(); ++r) EXPECT_EQ(c->world_rank_of(r), world_size() - 1 - r);
  // Group rank 0 (the last world rank) broadcasts its world rank.
  int32_t who = world_rank();
  c->broadcast(&who, 1, CommDType::kI32, 0);
  EXPECT_EQ(who, world_size() - 1);
  check_everything<int32_t>(*c, {0, 3, 17});
}

// Even and odd world ranks in two groups made at the same time: the groups must not mix.
inline void check_even_and_odd_groups(const std::string& backend) {
  const bool even = world_rank() % 2 == 0;
  auto c = even ? make_communicator(backend, ranks_where([](int q) { return q % 2 == 0; }), "even", kTimeout)
                : make_communicator(backend, ranks_where([](int q) { return q % 2 == 1; }), "odd", kTimeout);
  EXPECT_EQ(c->rank(), world_rank() / 2);
  EXPECT_EQ(c->size(), even ? (world_size() + 1) / 2 : world_size() / 2);
  int64_t sum = world_rank();
  c->all_reduce(&sum, 1, CommDType::kI64, ReduceOp::kSum);
  int64_t want = 0;
  for (int q = even ? 0 : 1; q < world_size(); q += 2) want += q;
  EXPECT_EQ(sum, want);
  if (c->size() > 1) {
    check_all_types(*c, {0, 5, 33});
  } else {
    check_everything<float>(*c, {0, 5});  // a group of one (np 2 or 3): copies only
  }
}

// {0,1} and {2,3} at the same time, then {0,2} and {1,3}: a rank belongs to two live groups.
// Needs 4 ranks (the caller skips otherwise).
inline void check_two_groups_per_rank(const std::string& backend) {
  const int r = world_rank();
  auto a = make_communicator(backend, r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, "low/high", kTimeout);
  auto b =
      make_communicator(backend, r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}, "even/odd", kTimeout);
  int64_t x = r + 1, y = r + 1;
  a->all_reduce(&x, 1, CommDType::kI64, ReduceOp::kSum);
  b->all_reduce(&y, 1, CommDType::kI64, ReduceOp::kSum);
  EXPECT_EQ(x, r < 2 ? 3 : 7);
  EXPECT_EQ(y, r % 2 == 0 ? 4 : 6);
  check_everything<float>(*a, {9});
  check_everything<int32_t>(*b, {9});
}

// A receive's wait for its sender is time inside the call: rank 0 sends 0.3 s late to rank 1,
// once by send/recv and once by isend/irecv with the wait later, and rank 1's seconds count both
// waits (the step rows' communication time relies on it, arch/stage_clock.h).
inline void check_waits_are_counted(Communicator& c) {
  if (c.size() < 2) return;
  constexpr double kLate = 0.3;
  int32_t x = 7;
  const double before = c.stats().seconds;
  if (c.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kLate));
    c.send(&x, 1, CommDType::kI32, 1, 5);
    std::this_thread::sleep_for(std::chrono::duration<double>(kLate));
    c.isend(&x, 1, CommDType::kI32, 1, 6)->wait();
  } else if (c.rank() == 1) {
    int32_t got = 0;
    c.recv(&got, 1, CommDType::kI32, 0, 5);
    EXPECT_EQ(got, 7);
    got = 0;
    auto r = c.irecv(&got, 1, CommDType::kI32, 0, 6);
    r->wait();
    EXPECT_EQ(got, 7);
    EXPECT_GE(c.stats().seconds - before, 2 * kLate * 0.8) << "a receive's wait was not counted";
  }
  c.barrier();
}

}  // namespace shardlm::comm_checks
