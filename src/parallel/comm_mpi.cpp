#include "parallel/comm_mpi.h"
#include "parallel/comm_stats_scope.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "parallel/meet_members.h"
#include "parallel/mpi_env.h"

namespace shardlm {

namespace {

using Clock = std::chrono::steady_clock;

// Busy-test (yielding the core to any runnable process) this long, then sleep between tests,
// starting at kSleepMinUs and doubling up to kSleepMaxUs.
constexpr double kSpinSeconds = 2e-3;
constexpr int kSleepMinUs = 50;
constexpr int kSleepMaxUs = 500;

MPI_Datatype mpi_type(CommDType t) {
  switch (t) {
    case CommDType::kF32: return MPI_FLOAT;
    case CommDType::kI32: return MPI_INT32_T;
    case CommDType::kI64: return MPI_INT64_T;
    case CommDType::kU8: return MPI_UINT8_T;
    case CommDType::kBF16: return MPI_UINT16_T;
  }
  SHARDLM_FAIL("unknown CommDType " << static_cast<int>(t));
}

// The type of a reduction: bf16 patterns are only moved (MPI would add them as integers).
MPI_Datatype mpi_reduce_type(CommDType t) {
  SHARDLM_CHECK(t != CommDType::kBF16, "the MPI communicator does not reduce bf16 values");
  return mpi_type(t);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  SHARDLM_FAIL("unknown ReduceOp " << static_cast<int>(op));
}

using comm_detail::at;
using comm_detail::cat;
using comm_detail::StatScope;

// Derived datatypes freed at scope exit (after the wait: MPI allows freeing earlier, but keeping
// them makes the lifetime obvious).
struct Types {
  std::vector<MPI_Datatype> owned;
  ~Types() {
    for (MPI_Datatype& t : owned)
      if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
  }
};

}  // namespace

int MpiCommunicator::group_tag(const std::vector<int>& members, int tag_ub) {
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the sorted ranks
  for (int r : sorted) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint64_t>((static_cast<uint32_t>(r) >> (8 * b)) & 0xffu);
      h *= 1099511628211ull;
    }
  }
  return static_cast<int>(h % (static_cast<uint64_t>(tag_ub) + 1));
}

MpiCommunicator::MpiCommunicator(const std::vector<int>& members, std::string name, double timeout_s)
    : members_(members), name_(std::move(name)), timeout_s_(timeout_s), max_count_(INT_MAX) {
  SHARDLM_CHECK(!members_.empty(), "communicator " << name_ << ": empty member list");
  const bool mpi = MpiEnv::initialized();
  const int world_size = mpi ? MpiEnv::size() : 1;
  world_rank_ = mpi ? MpiEnv::rank() : 0;
  std::vector<int> sorted = members_;
  std::sort(sorted.begin(), sorted.end());
  SHARDLM_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                "communicator " << name_ << ": world rank " << *std::adjacent_find(sorted.begin(), sorted.end())
                                << " listed twice");
  SHARDLM_CHECK(sorted.front() >= 0 && sorted.back() < world_size,
                "communicator " << name_ << ": members must be world ranks in [0, " << world_size << ")");
  auto it = std::find(members_.begin(), members_.end(), world_rank_);
  SHARDLM_CHECK(it != members_.end(), "communicator " << name_ << ": world rank " << world_rank_ << " is not a member");
  rank_ = static_cast<int>(it - members_.begin());
  if (members_.size() == 1) return;  // no MPI communicator for a group of one

  SHARDLM_CHECK(mpi, "communicator " << name_ << ": a group of " << members_.size() << " ranks needs MPI");
  void* attr = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &flag);
  const int tag_ub = flag ? *static_cast<int*>(attr) : 32767;
  meet_members(members_, rank_, "creating communicator " + name_, timeout_s_);
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
  check_mpi(MPI_Group_incl(world_group, size(), members_.data(), &group), "MPI_Group_incl");
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, group_tag(members_, tag_ub), &comm_);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  check_mpi(rc, "MPI_Comm_create_group");
  SHARDLM_CHECK(comm_ != MPI_COMM_NULL, "communicator " << name_ << ": MPI_Comm_create_group gave no communicator");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  std::string mpi_name = name_.substr(0, MPI_MAX_OBJECT_NAME - 1);
  MPI_Comm_set_name(comm_, mpi_name.c_str());
  int r = -1;
  MPI_Comm_rank(comm_, &r);
  SHARDLM_CHECK(r == rank_, "communicator " << name_ << ": MPI rank " << r << " != expected " << rank_);
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ != MPI_COMM_NULL && MpiEnv::initialized()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::set_max_count_per_call(size_t n) {
  SHARDLM_CHECK(n >= 1 && n <= static_cast<size_t>(INT_MAX), "max count per MPI call must be in [1, INT_MAX]");
  max_count_ = n;
}

int MpiCommunicator::world_rank_of(int r) const {
  SHARDLM_CHECK(r >= 0 && r < size(), "communicator " << name_ << ": group rank " << r << " outside [0, " << size() << ")");
  return members_[static_cast<size_t>(r)];
}

void MpiCommunicator::check_mpi(int rc, const char* what) const {
  if (rc == MPI_SUCCESS) return;
  SHARDLM_FAIL(what << " on group " << name_ << " failed on world rank " << world_rank_ << " (host " << MpiEnv::host()
                    << "): " << MpiEnv::error_text(rc));
}

void MpiCommunicator::check_peer(int r, const char* op) const {
  SHARDLM_CHECK(r >= 0 && r < size(), op << " on group " << name_ << ": peer " << r << " outside [0, " << size() << ")");
  SHARDLM_CHECK(r != rank_, op << " on group " << name_ << ": peer " << r << " is this rank");
}

std::string MpiCommunicator::all_peers() const {
  std::string s = size() == 2 ? "world rank " : "world ranks ";
  bool first = true;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    if (!first) s += ", ";
    s += std::to_string(members_[static_cast<size_t>(r)]);
    first = false;
  }
  return s;
}

std::string MpiCommunicator::peer_text(int group_rank) const {
  return "world rank " + std::to_string(members_[static_cast<size_t>(group_rank)]) + " (group rank " +
         std::to_string(group_rank) + ")";
}

void MpiCommunicator::wait_all(std::vector<MPI_Request>& reqs, const char* op, const std::string& peers) {
  if (reqs.empty()) return;
  const auto t0 = Clock::now();
  int sleep_us = kSleepMinUs;
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), op);
    if (done) return;
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (timeout_s_ > 0 && waited > timeout_s_) {
      SHARDLM_FAIL(op << " on group " << name_ << " timed out after " << timeout_s_ << " s on world rank " << world_rank_
                      << " (host " << MpiEnv::host() << "); peers: " << peers);
    }
    if (waited < kSpinSeconds) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, kSleepMaxUs);
    }
  }
}

namespace {

// One datatype covering `count` contiguous elements of `base` (count may exceed INT_MAX):
// a vector of q blocks of `piece` elements plus a remainder, resized to count elements.
MPI_Datatype block_type(size_t count, MPI_Datatype base, size_t es, size_t piece, Types& types) {
  const size_t q = count / piece, r = count % piece;
  SHARDLM_CHECK(q <= static_cast<size_t>(INT_MAX), "count " << count << " too large for one MPI datatype");
  MPI_Datatype vec = MPI_DATATYPE_NULL, rest = MPI_DATATYPE_NULL, whole = MPI_DATATYPE_NULL, sized = MPI_DATATYPE_NULL;
  if (q > 0) MPI_Type_vector(static_cast<int>(q), static_cast<int>(piece), static_cast<int>(piece), base, &vec);
  if (r > 0) MPI_Type_contiguous(static_cast<int>(r), base, &rest);
  if (q > 0 && r > 0) {
    int lens[2] = {1, 1};
    MPI_Aint displs[2] = {0, static_cast<MPI_Aint>(q * piece * es)};
    MPI_Datatype parts[2] = {vec, rest};
    MPI_Type_create_struct(2, lens, displs, parts, &whole);
    MPI_Type_free(&vec);
    MPI_Type_free(&rest);
  } else {
    whole = q > 0 ? vec : rest;
  }
  MPI_Type_create_resized(whole, 0, static_cast<MPI_Aint>(count * es), &sized);
  MPI_Type_free(&whole);
  MPI_Type_commit(&sized);
  types.owned.push_back(sized);
  return sized;
}

// `count` elements starting `offset` elements into the buffer, as one datatype (for alltoallw).
MPI_Datatype placed_type(size_t offset, size_t count, MPI_Datatype base, size_t es, size_t piece, Types& types) {
  MPI_Datatype block = block_type(count, base, es, piece, types);
  int len = 1;
  MPI_Aint displ = static_cast<MPI_Aint>(offset * es);
  MPI_Datatype placed = MPI_DATATYPE_NULL;
  MPI_Type_create_struct(1, &len, &displ, &block, &placed);
  MPI_Type_commit(&placed);
  types.owned.push_back(placed);
  return placed;
}

}  // namespace

void MpiCommunicator::all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) {
  const MPI_Datatype rt = mpi_reduce_type(t);  // refused on every rank, before anything moves
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, size() > 1 ? count * es : 0);
  if (size() == 1) return;
  std::vector<MPI_Request> reqs;
  size_t off = 0;
  do {
    const size_t n = std::min(max_count_, count - off);
    reqs.emplace_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, at(buf, off, es), static_cast<int>(n), rt, mpi_op(op), comm_,
                             &reqs.back()),
              "all_reduce");
    off += n;
  } while (off < count);
  wait_all(reqs, "all_reduce", all_peers());
}

void MpiCommunicator::all_gather(const void* send, void* recv, size_t count, CommDType t) {
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, size() > 1 ? count * es : 0);
  if (size() == 1) {
    if (count > 0 && send != recv) std::memmove(recv, send, count * es);
    return;
  }
  const void* sbuf = send == cat(recv, static_cast<size_t>(rank_) * count, es) ? MPI_IN_PLACE : send;
  Types types;
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  if (count <= max_count_) {
    check_mpi(MPI_Iallgather(sbuf, static_cast<int>(count), mpi_type(t), recv, static_cast<int>(count), mpi_type(t),
                             comm_, &reqs[0]),
              "all_gather");
  } else {
    MPI_Datatype bt = block_type(count, mpi_type(t), es, max_count_, types);
    check_mpi(MPI_Iallgather(sbuf, 1, bt, recv, 1, bt, comm_, &reqs[0]), "all_gather");
  }
  wait_all(reqs, "all_gather", all_peers());
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) {
  const MPI_Datatype rt = mpi_reduce_type(t);  // refused on every rank, before anything moves
  const size_t es = comm_dtype_size(t);
  const size_t n = static_cast<size_t>(size());
  StatScope st(stats_, size() > 1 ? n * count * es : 0);
  if (size() == 1) {
    if (count > 0 && send != recv) std::memmove(recv, send, count * es);
    return;
  }
  std::vector<MPI_Request> reqs;
  if (count <= max_count_) {
    reqs.emplace_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), rt, mpi_op(op), comm_, &reqs[0]),
              "reduce_scatter");
  } else {
    // Block q is reduced to rank q, in pieces (predefined reductions need predefined types).
    for (size_t q = 0; q < n; ++q) {
      for (size_t off = 0; off < count; off += max_count_) {
        const size_t len = std::min(max_count_, count - off);
        reqs.emplace_back(MPI_REQUEST_NULL);
        check_mpi(MPI_Ireduce(cat(send, q * count + off, es), q == static_cast<size_t>(rank_) ? at(recv, off, es) : nullptr,
                              static_cast<int>(len), rt, mpi_op(op), static_cast<int>(q), comm_, &reqs.back()),
                  "reduce_scatter");
      }
    }
  }
  wait_all(reqs, "reduce_scatter", all_peers());
}

void MpiCommunicator::all_to_all(const void* send, void* recv, size_t count, CommDType t) {
  const size_t es = comm_dtype_size(t);
  const size_t n = static_cast<size_t>(size());
  StatScope st(stats_, size() > 1 ? n * count * es : 0);
  if (size() == 1) {
    if (count > 0 && send != recv) std::memmove(recv, send, count * es);
    return;
  }
  Types types;
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  if (count <= max_count_) {
    check_mpi(MPI_Ialltoall(send, static_cast<int>(count), mpi_type(t), recv, static_cast<int>(count), mpi_type(t), comm_,
                            &reqs[0]),
              "all_to_all");
  } else {
    MPI_Datatype bt = block_type(count, mpi_type(t), es, max_count_, types);
    check_mpi(MPI_Ialltoall(send, 1, bt, recv, 1, bt, comm_, &reqs[0]), "all_to_all");
  }
  wait_all(reqs, "all_to_all", all_peers());
}

void MpiCommunicator::all_to_allv(const void* send, const std::vector<size_t>& send_counts,
                                  const std::vector<size_t>& send_displs, void* recv,
                                  const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                                  CommDType t) {
  const size_t n = static_cast<size_t>(size());
  SHARDLM_CHECK(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n && recv_displs.size() == n,
                "all_to_allv on group " << name_ << ": counts and displacements need " << n << " entries each");
  const size_t es = comm_dtype_size(t);
  size_t total = 0;
  for (size_t c : send_counts) total += c;
  StatScope st(stats_, size() > 1 ? total * es : 0);
  if (size() == 1) {
    SHARDLM_CHECK(send_counts[0] == recv_counts[0], "all_to_allv on group " << name_ << ": send count "
                                                                            << send_counts[0] << " != receive count "
                                                                            << recv_counts[0]);
    if (send_counts[0] > 0) std::memmove(at(recv, recv_displs[0], es), cat(send, send_displs[0], es), send_counts[0] * es);
    return;
  }
  // Every rank must take the same path: agree on whether anyone needs counts beyond int.
  int big = 0;
  for (size_t i = 0; i < n; ++i) {
    if (send_counts[i] > max_count_ || recv_counts[i] > max_count_ || send_displs[i] > max_count_ ||
        recv_displs[i] > max_count_)
      big = 1;
  }
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, &big, 1, MPI_INT, MPI_MAX, comm_, &reqs[0]), "all_to_allv");
  wait_all(reqs, "all_to_allv", all_peers());
  reqs[0] = MPI_REQUEST_NULL;
  const MPI_Datatype base = mpi_type(t);
  Types types;
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  std::vector<MPI_Datatype> stypes(n, base), rtypes(n, base);
  if (!big) {
    for (size_t i = 0; i < n; ++i) {
      sc[i] = static_cast<int>(send_counts[i]);
      sd[i] = static_cast<int>(send_displs[i]);
      rc[i] = static_cast<int>(recv_counts[i]);
      rd[i] = static_cast<int>(recv_displs[i]);
    }
    check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), base, recv, rc.data(), rd.data(), base, comm_, &reqs[0]),
              "all_to_allv");
  } else {
    // One derived type per peer carrying its own (64-bit) displacement; byte displacements 0.
    for (size_t i = 0; i < n; ++i) {
      if (send_counts[i] > 0) {
        stypes[i] = placed_type(send_displs[i], send_counts[i], base, es, max_count_, types);
        sc[i] = 1;
      }
      if (recv_counts[i] > 0) {
        rtypes[i] = placed_type(recv_displs[i], recv_counts[i], base, es, max_count_, types);
        rc[i] = 1;
      }
    }
    check_mpi(MPI_Ialltoallw(send, sc.data(), sd.data(), stypes.data(), recv, rc.data(), rd.data(), rtypes.data(), comm_,
                             &reqs[0]),
              "all_to_allv");
  }
  wait_all(reqs, "all_to_allv", all_peers());
}

void MpiCommunicator::broadcast(void* buf, size_t count, CommDType t, int root) {
  SHARDLM_CHECK(root >= 0 && root < size(), "broadcast on group " << name_ << ": root " << root << " outside [0, " << size() << ")");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, size() > 1 && root == rank_ ? count * es : 0);
  if (size() == 1) return;
  std::vector<MPI_Request> reqs;
  size_t off = 0;
  do {
    const size_t len = std::min(max_count_, count - off);
    reqs.emplace_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Ibcast(at(buf, off, es), static_cast<int>(len), mpi_type(t), root, comm_, &reqs.back()), "broadcast");
    off += len;
  } while (off < count);
  wait_all(reqs, "broadcast", rank_ == root ? all_peers() : "root " + peer_text(root));
}

// The pieces of one nonblocking send or receive, completed together.
class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MpiCommunicator& c, const char* op, std::string peers) : c_(c), op_(op), peers_(std::move(peers)) {}
  void wait() override {
    if (reqs_.empty()) return;
    comm_detail::WaitScope w(c_.stats_);
    finish();
  }
  // The wait, not counted apart: for a call that counts its whole time itself (send_recv).
  void finish() {
    if (!reqs_.empty()) c_.wait_all(reqs_, op_, peers_);
    reqs_.clear();
  }
  std::vector<MPI_Request> reqs_;

 private:
  MpiCommunicator& c_;
  const char* op_;
  std::string peers_;
};

// Posts a point-to-point transfer in pieces of at most max_count_ elements (pieces match in order:
// MPI messages between a pair do not overtake).
template <typename Post>
std::unique_ptr<CommRequest> MpiCommunicator::post_pieces(size_t count, size_t es, const char* op,
                                                          std::string peers, Post post) {
  auto r = std::make_unique<MpiRequest>(*this, op, std::move(peers));
  size_t off = 0;
  do {
    const size_t len = std::min(max_count_, count - off);
    r->reqs_.emplace_back(MPI_REQUEST_NULL);
    check_mpi(post(off * es, static_cast<int>(len), &r->reqs_.back()), op);
    off += len;
  } while (off < count);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::isend(const void* buf, size_t count, CommDType t, int peer, int tag) {
  check_peer(peer, "send");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, count * es);
  return post_pieces(count, es, "send", "receiver " + peer_text(peer), [&](size_t byte_off, int len, MPI_Request* q) {
    return MPI_Isend(static_cast<const char*>(buf) + byte_off, len, mpi_type(t), peer, tag, comm_, q);
  });
}

std::unique_ptr<CommRequest> MpiCommunicator::irecv(void* buf, size_t count, CommDType t, int peer, int tag) {
  check_peer(peer, "recv");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, 0);
  return post_pieces(count, es, "recv", "sender " + peer_text(peer), [&](size_t byte_off, int len, MPI_Request* q) {
    return MPI_Irecv(static_cast<char*>(buf) + byte_off, len, mpi_type(t), peer, tag, comm_, q);
  });
}

void MpiCommunicator::send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count,
                                int source, CommDType t, int tag) {
  check_peer(dest, "send_recv");
  check_peer(source, "send_recv");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, send_count * es);
  // Both posted before either is waited on, so a ring of send_recv calls cannot deadlock.
  auto r = post_pieces(recv_count, es, "send_recv", "sender " + peer_text(source),
                       [&](size_t byte_off, int len, MPI_Request* q) {
                         return MPI_Irecv(static_cast<char*>(recv) + byte_off, len, mpi_type(t), source, tag, comm_, q);
                       });
  auto s = post_pieces(send_count, es, "send_recv", "receiver " + peer_text(dest),
                       [&](size_t byte_off, int len, MPI_Request* q) {
                         return MPI_Isend(static_cast<const char*>(send) + byte_off, len, mpi_type(t), dest, tag, comm_, q);
                       });
  static_cast<MpiRequest&>(*s).finish();  // the StatScope above counts the waits
  static_cast<MpiRequest&>(*r).finish();
}

void MpiCommunicator::barrier() {
  StatScope st(stats_, 0);
  if (size() == 1) return;
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Ibarrier(comm_, &reqs[0]), "barrier");
  wait_all(reqs, "barrier", all_peers());
}

}  // namespace shardlm
