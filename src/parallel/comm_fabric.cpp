#include "parallel/comm_fabric.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "parallel/comm_mpi.h"
#include "parallel/comm_stats_scope.h"
#include "parallel/fabric_endpoint.h"
#include "parallel/mpi_env.h"

namespace shardlm {

namespace {

using comm_detail::at;
using comm_detail::cat;
using comm_detail::StatScope;

constexpr uint64_t kCollectiveBit = uint64_t{1} << 63;
constexpr int kMaxGroup = 1 << 16;
// Pieces no larger than this even where the provider allows more (tcp says 2^64 - 1): a bound that
// every provider's length fields handle.
constexpr size_t kPieceCap = size_t{1} << 30;

template <typename T, typename F>
void accumulate(T* acc, const T* x, size_t len, F f) {
  for (size_t i = 0; i < len; ++i) acc[i] = f(acc[i], x[i]);
}

// acc = src[0] op src[1] op ... in that order, a pass per source (each one vectorises); acc must
// not be one of the sources.
template <typename T>
void reduce_typed(void* acc_v, const std::vector<const char*>& src, size_t len, ReduceOp op) {
  T* acc = static_cast<T*>(acc_v);
  std::memcpy(acc, src[0], len * sizeof(T));
  for (size_t q = 1; q < src.size(); ++q) {
    const T* x = reinterpret_cast<const T*>(src[q]);
    switch (op) {
      case ReduceOp::kSum:
        accumulate(acc, x, len, [](T a, T b) { return static_cast<T>(a + b); });
        break;
      case ReduceOp::kMax:
        accumulate(acc, x, len, [](T a, T b) { return b > a ? b : a; });
        break;
      case ReduceOp::kMin:
        accumulate(acc, x, len, [](T a, T b) { return b < a ? b : a; });
        break;
    }
  }
}

void reduce_in_order(void* acc, const std::vector<const char*>& src, size_t len, CommDType t, ReduceOp op) {
  switch (t) {
    case CommDType::kF32:
      return reduce_typed<float>(acc, src, len, op);
    case CommDType::kI32:
      return reduce_typed<int32_t>(acc, src, len, op);
    case CommDType::kI64:
      return reduce_typed<int64_t>(acc, src, len, op);
    case CommDType::kU8:
      return reduce_typed<uint8_t>(acc, src, len, op);
    case CommDType::kBF16:
      break;  // refused before anything moved (check_reducible)
  }
  SHARDLM_FAIL("unknown CommDType " << static_cast<int>(t));
}

// Every rank refuses alike, before the call's sequence number is taken or anything is sent.
void check_reducible(CommDType t) {
  SHARDLM_CHECK(t != CommDType::kBF16, "the libfabric communicator does not reduce bf16 values");
}

}  // namespace

// The operations of one call, released (freed, or left to finish) when the batch goes.
class FabricCommunicator::Batch {
 public:
  Batch(FabricEndpoint* ep, bool collective, const char* op) : ep_(ep), collective_(collective), op_(op) {}
  ~Batch() { clear(); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  void clear() {
    for (FabricOp* op : ops_) ep_->release(op);
    ops_.clear();
  }
  FabricEndpoint* ep_;
  bool collective_;
  const char* op_;  // the call's name, for the watchdog
  std::vector<FabricOp*> ops_;
};

class FabricRequest final : public CommRequest {
 public:
  FabricRequest(FabricCommunicator& c, const char* op) : c_(c), op_(op), b_(c.ep_.get(), false, op) {}
  void wait() override {
    comm_detail::WaitScope w(c_.stats_);
    c_.wait(b_, op_);
    b_.clear();
  }
  FabricCommunicator::Batch& batch() { return b_; }

 private:
  FabricCommunicator& c_;
  const char* op_;
  FabricCommunicator::Batch b_;
};

uint64_t FabricCommunicator::p2p_tag(int tag, int sender) {
  SHARDLM_CHECK(tag >= 0, "fabric communicator: message tag " << tag << " is negative");
  return (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 16) | static_cast<uint64_t>(sender);
}

uint64_t FabricCommunicator::collective_tag(uint32_t seq, int phase, int sender) {
  return kCollectiveBit | (static_cast<uint64_t>(seq & 0x7fffffffu) << 24) |
         (static_cast<uint64_t>(phase & 0xff) << 16) | static_cast<uint64_t>(sender);
}

FabricCommunicator::FabricCommunicator(const std::vector<int>& members, std::string name, double timeout_s)
    : boot_(std::make_unique<MpiCommunicator>(members, name, timeout_s)),
      members_(members),
      timeout_s_(timeout_s),
      max_piece_(kPieceCap) {
  SHARDLM_CHECK(size() <= kMaxGroup,
                "fabric communicator " << name << ": " << size() << " members, at most " << kMaxGroup);
  watchdog_ = std::make_unique<CommWatchdog>(size() > 1 ? CommWatchdog::limit_for(timeout_s) : 0,
                                             [this](const char* op) { return stuck_text(op); });
  if (size() == 1) return;
  // Rank 0 chooses the provider (FI_PROVIDER and libfabric's order apply there), everyone opens it.
  // A group on one node, with no FI_PROVIDER, takes shm: libfabric's order puts the network
  // providers first, and over loopback tcp a small message costs several times what it does in
  // shared memory.
  const bool one_node = on_one_node();
  std::string provider, error;
  if (rank() == 0) {
    try {
      if (one_node && !std::getenv("FI_PROVIDER")) {
        try {
          ep_ = std::make_unique<FabricEndpoint>("shm");
        } catch (const Error&) {
          ep_.reset();  // no usable shm here: libfabric's first choice below
        }
      }
      if (!ep_) ep_ = std::make_unique<FabricEndpoint>("");
      provider = ep_->provider();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  int64_t len = error.empty() ? static_cast<int64_t>(provider.size()) : -1;
  boot_->broadcast(&len, 1, CommDType::kI64, 0);
  SHARDLM_CHECK(len >= 0, (rank() == 0 ? error
                                       : "fabric communicator " + this->name() +
                                             ": group rank 0 could not open a libfabric endpoint"));
  provider.resize(static_cast<size_t>(len));
  boot_->broadcast(provider.data(), provider.size(), CommDType::kU8, 0);
  if (rank() != 0) {
    try {
      ep_ = std::make_unique<FabricEndpoint>(provider);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Everyone learns who failed, so nobody waits for an endpoint that will never exist.
  std::vector<int32_t> ok(static_cast<size_t>(size()));
  const int32_t mine = error.empty() ? 1 : 0;
  boot_->all_gather(&mine, ok.data(), 1, CommDType::kI32);
  if (!error.empty()) SHARDLM_FAIL(error);
  for (int r = 0; r < size(); ++r)
    SHARDLM_CHECK(ok[static_cast<size_t>(r)], "fabric communicator " << this->name() << ": " << peer_text(r)
                                                                     << " could not open provider " << provider);

  // Endpoint names, all-gathered in fixed-size slots.
  const std::vector<uint8_t> addr = ep_->address();
  int64_t longest = static_cast<int64_t>(addr.size());
  boot_->all_reduce(&longest, 1, CommDType::kI64, ReduceOp::kMax);
  const size_t slot = static_cast<size_t>(longest) + sizeof(int64_t);
  std::vector<uint8_t> mine_slot(slot, 0), all(slot * static_cast<size_t>(size()));
  const int64_t my_len = static_cast<int64_t>(addr.size());
  std::memcpy(mine_slot.data(), &my_len, sizeof my_len);
  std::copy(addr.begin(), addr.end(), mine_slot.begin() + sizeof(int64_t));
  boot_->all_gather(mine_slot.data(), all.data(), slot, CommDType::kU8);
  std::vector<std::vector<uint8_t>> names(static_cast<size_t>(size()));
  for (size_t r = 0; r < names.size(); ++r) {
    int64_t l = 0;
    std::memcpy(&l, all.data() + r * slot, sizeof l);
    const uint8_t* p = all.data() + r * slot + sizeof(int64_t);
    names[r].assign(p, p + l);
  }
  ep_->insert_peers(names);
  // One piece size for all (the same provider reports the same maximum; take the least anyway).
  int64_t piece = static_cast<int64_t>(std::min(ep_->max_message_bytes(), kPieceCap));
  boot_->all_reduce(&piece, 1, CommDType::kI64, ReduceOp::kMin);
  max_piece_ = static_cast<size_t>(piece);
  SHARDLM_CHECK(max_piece_ > 0,
                "fabric communicator " << this->name() << ": provider " << provider << " allows no message bytes");
}

FabricCommunicator::~FabricCommunicator() = default;

std::string FabricCommunicator::stuck_text(const char* op) const {
  // Which peers are pending is the calling thread's to know, and it is stuck: name every other
  // member, as a collective's timeout would when none has answered.
  std::ostringstream peers;
  peers << (size() == 2 ? "world rank " : "world ranks ");
  for (int r = 0, n = 0; r < size(); ++r) {
    if (r != rank()) peers << (n++ ? ", " : "") << members_[static_cast<size_t>(r)];
  }
  std::ostringstream m;
  m << (op ? op : "a call") << " on group " << name() << " timed out after " << timeout_s_ << " s on world rank "
    << members_[static_cast<size_t>(rank())] << " (host " << MpiEnv::host() << "); peers: " << peers.str()
    << " (the call had not come back from libfabric provider " << (ep_ ? ep_->provider() : std::string("?"))
    << " after " << CommWatchdog::limit_for(timeout_s_) << " s, so its own deadline could not end it)";
  return m.str();
}

bool FabricCommunicator::on_one_node() {
  // FNV-1a of the host name, all-gathered: equal everywhere means one node.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : MpiEnv::host()) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  const int64_t mine = static_cast<int64_t>(h);
  std::vector<int64_t> all(static_cast<size_t>(size()));
  boot_->all_gather(&mine, all.data(), 1, CommDType::kI64);
  return std::all_of(all.begin(), all.end(), [&](int64_t x) { return x == mine; });
}

int FabricCommunicator::rank() const { return boot_->rank(); }
int FabricCommunicator::size() const { return boot_->size(); }
const std::string& FabricCommunicator::name() const { return boot_->name(); }
int FabricCommunicator::world_rank_of(int r) const { return boot_->world_rank_of(r); }
std::string FabricCommunicator::provider() const { return ep_ ? ep_->provider() : ""; }
std::string FabricCommunicator::fabric() const { return ep_ ? ep_->fabric() : ""; }
std::string FabricCommunicator::domain() const { return ep_ ? ep_->domain() : ""; }

std::string FabricCommunicator::transport() const {
  if (!ep_) return "libfabric (group of one: no endpoint)";
  return "libfabric " + ep_->provider() + " (fabric " + ep_->fabric() + ", domain " + ep_->domain() +
         (ep_->registers_buffers() ? ", buffers registered per message" : "") + ")";
}

void FabricCommunicator::set_one_shot_bytes(size_t n) { one_shot_bytes_ = n; }

void FabricCommunicator::register_every_buffer() {
  if (ep_) ep_->register_every_buffer();
}

void FabricCommunicator::set_max_message_bytes(size_t n) {
  SHARDLM_CHECK(n >= 1, "fabric communicator: the message size limit must be at least 1 byte");
  max_piece_ = std::min(n, ep_ ? std::min(ep_->max_message_bytes(), kPieceCap) : kPieceCap);
}

std::string FabricCommunicator::peer_text(int group_rank) const {
  return "world rank " + std::to_string(members_[static_cast<size_t>(group_rank)]) + " (group rank " +
         std::to_string(group_rank) + ")";
}

void FabricCommunicator::check_peer(int r, const char* op) const {
  SHARDLM_CHECK(r >= 0 && r < size(),
                op << " on group " << name() << ": peer " << r << " outside [0, " << size() << ")");
  SHARDLM_CHECK(r != rank(), op << " on group " << name() << ": peer " << r << " is this rank");
}

void FabricCommunicator::post_send(Batch& b, const void* buf, size_t bytes, int peer, uint64_t tag) {
  CommWatchdog::Busy busy(*watchdog_, b.op_);
  size_t off = 0;
  try {
    do {
      const size_t len = std::min(max_piece_, bytes - off);
      b.ops_.push_back(ep_->post_send(static_cast<const char*>(buf) + off, len, peer, tag, timeout_s_));
      off += len;
    } while (off < bytes);
  } catch (const Error& e) {
    post_failed(b, "send to ", peer, e);
  }
}

void FabricCommunicator::post_recv(Batch& b, void* buf, size_t bytes, int peer, uint64_t tag) {
  CommWatchdog::Busy busy(*watchdog_, b.op_);
  size_t off = 0;
  try {
    do {
      const size_t len = std::min(max_piece_, bytes - off);
      b.ops_.push_back(ep_->post_recv(static_cast<char*>(buf) + off, len, peer, tag, timeout_s_));
      off += len;
    } while (off < bytes);
  } catch (const Error& e) {
    post_failed(b, "receive from ", peer, e);
  }
}

void FabricCommunicator::post_failed(const Batch& b, const char* direction, int peer, const Error& e) const {
  // The endpoint knows the provider's answer (a full queue past the deadline, an error code); the
  // call, the group and the peer are known here.
  SHARDLM_FAIL(b.op_ << " on group " << name() << " failed on world rank " << members_[static_cast<size_t>(rank())]
                     << " (host " << MpiEnv::host() << "): " << direction << peer_text(peer) << ": " << e.what());
}

void FabricCommunicator::wait(Batch& b, const char* op) {
  CommWatchdog::Busy busy(*watchdog_, op);
  using Clock = std::chrono::steady_clock;
  constexpr double kSpinSeconds = 2e-3;
  const auto t0 = Clock::now();
  int sleep_us = 50;
  const int world = members_[static_cast<size_t>(rank())];
  for (;;) {
    int seen = 0;
    try {
      seen = ep_->progress();
    } catch (const Error& e) {
      // A completion-queue error belongs to no single operation: name the call, the group and
      // the peers it was waiting for.
      std::string peers;
      for (const FabricOp* o : b.ops_)
        if (!o->done) peers += (peers.empty() ? "" : ", ") + peer_text(o->peer);
      SHARDLM_FAIL(op << " on group " << name() << " failed on world rank " << world << " (host " << MpiEnv::host()
                      << "), waiting on " << (peers.empty() ? std::string("no peer") : peers) << ": " << e.what());
    }
    bool all_done = true;
    for (const FabricOp* o : b.ops_) {
      if (!o->done) {
        all_done = false;
        continue;
      }
      SHARDLM_CHECK(o->error.empty(), op << " on group " << name() << " failed on world rank " << world << " (host "
                                         << MpiEnv::host() << "): " << (o->is_send ? "send to " : "receive from ")
                                         << peer_text(o->peer) << ": " << o->error);
      SHARDLM_CHECK(o->is_send || o->got == o->bytes, op << " on group " << name() << " on world rank " << world
                                                         << " (host " << MpiEnv::host() << "): received " << o->got
                                                         << " bytes from " << peer_text(o->peer) << ", expected "
                                                         << o->bytes << " (the members disagree on a count)");
    }
    if (all_done) return;
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (timeout_s_ > 0 && waited > timeout_s_) {
      // Name the peers still pending: for a collective its ranks, for a message its direction.
      std::vector<int> pending;
      std::string peers;
      for (const FabricOp* o : b.ops_) {
        if (o->done) continue;
        if (b.collective_) {
          if (std::find(pending.begin(), pending.end(), o->peer) == pending.end()) pending.push_back(o->peer);
        } else if (peers.empty()) {
          peers = (o->is_send ? "receiver " : "sender ") + peer_text(o->peer);
        }
      }
      if (b.collective_) {
        std::sort(pending.begin(), pending.end());
        peers = pending.size() == 1 ? "world rank " : "world ranks ";
        for (size_t i = 0; i < pending.size(); ++i)
          peers += (i ? ", " : "") + std::to_string(members_[static_cast<size_t>(pending[i])]);
      }
      SHARDLM_FAIL(op << " on group " << name() << " timed out after " << timeout_s_ << " s on world rank " << world
                      << " (host " << MpiEnv::host() << "); peers: " << peers);
    }
    if (seen > 0) continue;
    if (waited < kSpinSeconds) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 500);
    }
  }
}

void FabricCommunicator::reduce_blocks(const void* in, const std::vector<size_t>& offs, const std::vector<size_t>& lens,
                                       void* out, CommDType t, ReduceOp op, const char* what, uint32_t seq) {
  const int n = size(), me = rank();
  const size_t es = comm_dtype_size(t);
  const size_t mine = lens[static_cast<size_t>(me)];
  scratch_.resize(static_cast<size_t>(n) * mine * es);
  Batch b(ep_.get(), true, what);
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    post_recv(b, scratch_.data() + static_cast<size_t>(q) * mine * es, mine * es, q, collective_tag(seq, 0, q));
  }
  // Each rank starts with the next one, so that not everyone sends to rank 0 first.
  for (int d = 1; d < n; ++d) {
    const int q = (me + d) % n;
    post_send(b, cat(in, offs[static_cast<size_t>(q)], es), lens[static_cast<size_t>(q)] * es, q,
              collective_tag(seq, 0, me));
  }
  wait(b, what);
  if (mine == 0) return;
  // The sum builds in scratch slot `me` (no message lands there), then goes to out, which may be
  // this rank's own block of `in`.
  std::vector<const char*> src(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q)
    src[static_cast<size_t>(q)] =
        q == me ? cat(in, offs[static_cast<size_t>(me)], es) : scratch_.data() + static_cast<size_t>(q) * mine * es;
  char* acc = scratch_.data() + static_cast<size_t>(me) * mine * es;
  reduce_in_order(acc, src, mine, t, op);
  std::memcpy(out, acc, mine * es);
}

void FabricCommunicator::all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) {
  check_reducible(t);
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, size() > 1 ? count * es : 0);
  if (size() == 1) return;
  const uint32_t seq = seq_++;
  if (count == 0) return;
  const size_t n = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
  if ((n - 1) * count * es <= one_shot_bytes_) {
    // Small: every rank sends its whole buffer to every other and reduces all of it, one message
    // latency instead of two. The same rank order, so the same bits as the two-phase path.
    reduce_blocks(buf, std::vector<size_t>(n, 0), std::vector<size_t>(n, count), buf, t, op, "all_reduce", seq);
    return;
  }
  std::vector<size_t> offs(n), lens(n);
  for (size_t b = 0; b < n; ++b) {
    offs[b] = count * b / n;
    lens[b] = count * (b + 1) / n - offs[b];
  }
  reduce_blocks(buf, offs, lens, at(buf, offs[me], es), t, op, "all_reduce", seq);
  Batch b(ep_.get(), true, "all_reduce");
  for (size_t q = 0; q < n; ++q)
    if (q != me)
      post_recv(b, at(buf, offs[q], es), lens[q] * es, static_cast<int>(q),
                collective_tag(seq, 1, static_cast<int>(q)));
  for (size_t d = 1; d < n; ++d) {
    const size_t q = (me + d) % n;
    post_send(b, cat(buf, offs[me], es), lens[me] * es, static_cast<int>(q),
              collective_tag(seq, 1, static_cast<int>(me)));
  }
  wait(b, "all_reduce");
}

void FabricCommunicator::reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) {
  check_reducible(t);
  const size_t es = comm_dtype_size(t);
  const size_t n = static_cast<size_t>(size());
  StatScope st(stats_, size() > 1 ? n * count * es : 0);
  if (size() == 1) {
    if (count > 0 && send != recv) std::memmove(recv, send, count * es);
    return;
  }
  const uint32_t seq = seq_++;
  if (count == 0) return;
  std::vector<size_t> offs(n), lens(n, count);
  for (size_t b = 0; b < n; ++b) offs[b] = b * count;
  reduce_blocks(send, offs, lens, recv, t, op, "reduce_scatter", seq);
}

void FabricCommunicator::all_gather(const void* send, void* recv, size_t count, CommDType t) {
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, size() > 1 ? count * es : 0);
  const size_t n = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
  if (count > 0 && send != cat(recv, me * count, es)) std::memmove(at(recv, me * count, es), send, count * es);
  if (size() == 1) return;
  const uint32_t seq = seq_++;
  if (count == 0) return;
  Batch b(ep_.get(), true, "all_gather");
  for (size_t q = 0; q < n; ++q)
    if (q != me)
      post_recv(b, at(recv, q * count, es), count * es, static_cast<int>(q),
                collective_tag(seq, 0, static_cast<int>(q)));
  for (size_t d = 1; d < n; ++d)
    post_send(b, cat(recv, me * count, es), count * es, static_cast<int>((me + d) % n),
              collective_tag(seq, 0, static_cast<int>(me)));
  wait(b, "all_gather");
}

void FabricCommunicator::all_to_all(const void* send, void* recv, size_t count, CommDType t) {
  const size_t n = static_cast<size_t>(size());
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, size() > 1 ? n * count * es : 0);
  std::vector<size_t> counts(n, count), displs(n);
  for (size_t q = 0; q < n; ++q) displs[q] = q * count;
  exchange(send, counts, displs, recv, counts, displs, t, "all_to_all");
}

void FabricCommunicator::all_to_allv(const void* send, const std::vector<size_t>& send_counts,
                                     const std::vector<size_t>& send_displs, void* recv,
                                     const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                                     CommDType t) {
  const size_t n = static_cast<size_t>(size());
  SHARDLM_CHECK(
      send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n && recv_displs.size() == n,
      "all_to_allv on group " << name() << ": counts and displacements need " << n << " entries each");
  size_t total = 0;
  for (size_t c : send_counts) total += c;
  StatScope st(stats_, size() > 1 ? total * comm_dtype_size(t) : 0);
  exchange(send, send_counts, send_displs, recv, recv_counts, recv_displs, t, "all_to_allv");
}

void FabricCommunicator::exchange(const void* send, const std::vector<size_t>& send_counts,
                                  const std::vector<size_t>& send_displs, void* recv,
                                  const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                                  CommDType t, const char* what) {
  const size_t n = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
  const size_t es = comm_dtype_size(t);
  SHARDLM_CHECK(send_counts[me] == recv_counts[me], what << " on group " << name() << ": send count " << send_counts[me]
                                                         << " to this rank != receive count " << recv_counts[me]);
  if (send_counts[me] > 0)
    std::memmove(at(recv, recv_displs[me], es), cat(send, send_displs[me], es), send_counts[me] * es);
  if (size() == 1) return;
  const uint32_t seq = seq_++;
  // Every pair exchanges a message, empty ones too: a count the two sides disagree on then fails
  // the call (a length mismatch) instead of leaving a message behind.
  Batch b(ep_.get(), true, what);
  for (size_t q = 0; q < n; ++q)
    if (q != me)
      post_recv(b, at(recv, recv_displs[q], es), recv_counts[q] * es, static_cast<int>(q),
                collective_tag(seq, 0, static_cast<int>(q)));
  for (size_t d = 1; d < n; ++d) {
    const size_t q = (me + d) % n;
    post_send(b, cat(send, send_displs[q], es), send_counts[q] * es, static_cast<int>(q),
              collective_tag(seq, 0, static_cast<int>(me)));
  }
  wait(b, what);
}

void FabricCommunicator::broadcast(void* buf, size_t count, CommDType t, int root) {
  SHARDLM_CHECK(root >= 0 && root < size(),
                "broadcast on group " << name() << ": root " << root << " outside [0, " << size() << ")");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, size() > 1 && root == rank() ? count * es : 0);
  if (size() == 1) return;
  const uint32_t seq = seq_++;
  if (count == 0) return;
  // Binomial tree over ranks relative to the root: receive from the parent, then send to the
  // children, farthest first.
  const int n = size(), rel = (rank() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (rel & mask) {
      Batch b(ep_.get(), true, "broadcast");
      const int parent = (rel - mask + root) % n;
      post_recv(b, buf, count * es, parent, collective_tag(seq, 0, parent));
      wait(b, "broadcast");
      break;
    }
    mask <<= 1;
  }
  Batch b(ep_.get(), true, "broadcast");
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (rel + mask < n) post_send(b, buf, count * es, (rel + mask + root) % n, collective_tag(seq, 0, rank()));
  wait(b, "broadcast");
}

std::unique_ptr<CommRequest> FabricCommunicator::isend(const void* buf, size_t count, CommDType t, int peer, int tag) {
  check_peer(peer, "send");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, count * es);
  auto r = std::make_unique<FabricRequest>(*this, "send");
  post_send(r->batch(), buf, count * es, peer, p2p_tag(tag, rank()));
  return r;
}

std::unique_ptr<CommRequest> FabricCommunicator::irecv(void* buf, size_t count, CommDType t, int peer, int tag) {
  check_peer(peer, "recv");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, 0);
  auto r = std::make_unique<FabricRequest>(*this, "recv");
  post_recv(r->batch(), buf, count * es, peer, p2p_tag(tag, peer));
  return r;
}

void FabricCommunicator::send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count,
                                   int source, CommDType t, int tag) {
  check_peer(dest, "send_recv");
  check_peer(source, "send_recv");
  const size_t es = comm_dtype_size(t);
  StatScope st(stats_, send_count * es);
  Batch b(ep_.get(), false, "send_recv");
  post_recv(b, recv, recv_count * es, source, p2p_tag(tag, source));
  post_send(b, send, send_count * es, dest, p2p_tag(tag, rank()));
  wait(b, "send_recv");
}

void FabricCommunicator::barrier() {
  StatScope st(stats_, 0);
  if (size() == 1) return;
  const uint32_t seq = seq_++;
  // Dissemination: in round k every rank signals rank + 2^k and hears from rank - 2^k.
  const int n = size(), me = rank();
  int round = 0;
  for (int k = 1; k < n; k <<= 1, ++round) {
    Batch b(ep_.get(), true, "barrier");
    const int from = (me - k + n) % n;
    post_recv(b, nullptr, 0, from, collective_tag(seq, round, from));
    post_send(b, nullptr, 0, (me + k) % n, collective_tag(seq, round, me));
    wait(b, "barrier");
  }
}

}  // namespace shardlm
