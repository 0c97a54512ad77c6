#include "parallel/comm_staged.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <utility>

#include "core/error.h"

namespace shardlm {

namespace {


// The host side of one buffer of an operation: the buffer itself when it is host memory (or
// empty), else a staging buffer from the pool. The staging buffer goes back to the pool at scope
// exit, unless an exception is leaving the scope: then the inner operation may still be writing
// to it (an abandoned MPI request) and it is kept out of the pool for good.
class Staged {
 public:
  Staged(StagedCommunicator& c, const void* buf, size_t bytes)
      : c_(c), user_(const_cast<void*>(buf)), bytes_(bytes), exceptions_(std::uncaught_exceptions()) {
    if (bytes_ > 0 && c_.memory().is_device(buf)) {
      s_ = c_.acquire(bytes_);
      device_ = true;
    }
  }
  ~Staged() {
    if (device_ && std::uncaught_exceptions() == exceptions_) c_.release(s_);
  }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;

  bool device() const { return device_; }
  void* host() const { return device_ ? s_.ptr : user_; }
  // Device -> staging, `bytes` from byte offset `off` (the whole buffer by default).
  void copy_in(size_t off = 0, size_t bytes = SIZE_MAX) {
    if (!device_) return;
    StagedCommunicator::CopyTime t(c_);
    c_.memory().to_host(static_cast<char*>(s_.ptr) + off, static_cast<char*>(user_) + off, len(off, bytes));
  }
  void copy_out(size_t off = 0, size_t bytes = SIZE_MAX) {
    if (!device_) return;
    StagedCommunicator::CopyTime t(c_);
    c_.memory().to_device(static_cast<char*>(user_) + off, static_cast<char*>(s_.ptr) + off, len(off, bytes));
  }
  // Hands the staging buffer over to a request (which releases it after wait()).
  StagedCommunicator::Staging take() {
    device_ = false;
    return s_;
  }

 private:
  size_t len(size_t off, size_t bytes) const { return bytes == SIZE_MAX ? bytes_ - off : bytes; }
  StagedCommunicator& c_;
  void* user_;
  size_t bytes_;
  int exceptions_;
  StagedCommunicator::Staging s_;
  bool device_ = false;
};

// A nonblocking send or receive through a staging buffer: wait() completes the inner request,
// then (receive) copies the message to the device buffer and returns the staging buffer. A host
// buffer's request has no staging buffer: only the wait's time is taken into the stats.
class StagedRequest final : public CommRequest {
 public:
  StagedRequest(StagedCommunicator& c, std::unique_ptr<CommRequest> inner, StagedCommunicator::Staging s,
                void* device_dst, size_t bytes)
      : c_(c), inner_(std::move(inner)), s_(s), device_dst_(device_dst), bytes_(bytes) {}
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    c_.sync_stats();
    if (device_dst_ != nullptr) {
      StagedCommunicator::CopyTime t(c_);
      c_.memory().to_device(device_dst_, s_.ptr, bytes_);
    }
    if (s_.ptr != nullptr) c_.release(s_);
  }

 private:
  StagedCommunicator& c_;
  std::unique_ptr<CommRequest> inner_;
  StagedCommunicator::Staging s_;
  void* device_dst_;  // null for a send
  size_t bytes_;
};

}  // namespace

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<MemorySpace> memory)
    : inner_(std::move(inner)), memory_(std::move(memory)) {
  SHARDLM_CHECK(inner_ && memory_, "StagedCommunicator needs an inner communicator and a memory space");
  sync_stats();
}

StagedCommunicator::~StagedCommunicator() {
  for (Staging& s : free_) memory_->free_host_staging(s.ptr);
}

StagedCommunicator::Staging StagedCommunicator::acquire(size_t bytes) {
  // The smallest free buffer that fits; else a new one of the next power of two, so that sizes
  // that vary from step to step (a tp all-reduce of T x H) reuse a few buffers instead of pinning
  // one more for every new largest size.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
  if (best != free_.end()) {
    Staging s = *best;
    free_.erase(best);
    return s;
  }
  size_t rounded = 4096;
  while (rounded < bytes) rounded *= 2;
  return Staging{memory_->alloc_host_staging(rounded), rounded};
}

void StagedCommunicator::release(Staging s) {
  if (s.ptr != nullptr) free_.push_back(s);
}

void StagedCommunicator::all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) {
  Staged b(*this, buf, count * comm_dtype_size(t));
  b.copy_in();
  inner_->all_reduce(b.host(), count, t, op);
  b.copy_out();
  sync_stats();
}

void StagedCommunicator::all_gather(const void* send, void* recv, size_t count, CommDType t) {
  const size_t es = comm_dtype_size(t), n = static_cast<size_t>(size());
  // Staged separately even when send aliases this rank's block of recv: the inner call then sees
  // two distinct host buffers holding the same data, which gives the in-place result.
  Staged s(*this, send, count * es), r(*this, recv, n * count * es);
  s.copy_in();
  inner_->all_gather(s.host(), r.host(), count, t);
  r.copy_out();
  sync_stats();
}

void StagedCommunicator::reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) {
  const size_t es = comm_dtype_size(t), n = static_cast<size_t>(size());
  Staged s(*this, send, n * count * es), r(*this, recv, count * es);
  s.copy_in();
  inner_->reduce_scatter(s.host(), r.host(), count, t, op);
  r.copy_out();
  sync_stats();
}

void StagedCommunicator::all_to_all(const void* send, void* recv, size_t count, CommDType t) {
  const size_t es = comm_dtype_size(t), n = static_cast<size_t>(size());
  Staged s(*this, send, n * count * es), r(*this, recv, n * count * es);
  s.copy_in();
  inner_->all_to_all(s.host(), r.host(), count, t);
  r.copy_out();
  sync_stats();
}

void StagedCommunicator::all_to_allv(const void* send, const std::vector<size_t>& send_counts,
                                     const std::vector<size_t>& send_displs, void* recv,
                                     const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                                     CommDType t) {
  const size_t n = static_cast<size_t>(size());
  SHARDLM_CHECK(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n && recv_displs.size() == n,
                "all_to_allv on group " << name() << ": counts and displacements need " << n << " entries each");
  const size_t es = comm_dtype_size(t);
  size_t send_end = 0, recv_end = 0;  // extents in elements
  for (size_t i = 0; i < n; ++i) {
    if (send_counts[i] > 0) send_end = std::max(send_end, send_displs[i] + send_counts[i]);
    if (recv_counts[i] > 0) recv_end = std::max(recv_end, recv_displs[i] + recv_counts[i]);
  }
  Staged s(*this, send, send_end * es), r(*this, recv, recv_end * es);
  s.copy_in();  // the whole extent: reading the gaps is harmless
  inner_->all_to_allv(s.host(), send_counts, send_displs, r.host(), recv_counts, recv_displs, t);
  for (size_t i = 0; i < n; ++i)  // only the received blocks: the gaps of recv stay as they were
    if (recv_counts[i] > 0) r.copy_out(recv_displs[i] * es, recv_counts[i] * es);
  sync_stats();
}

void StagedCommunicator::broadcast(void* buf, size_t count, CommDType t, int root) {
  Staged b(*this, buf, count * comm_dtype_size(t));
  if (rank() == root) b.copy_in();
  inner_->broadcast(b.host(), count, t, root);
  if (rank() != root) b.copy_out();
  sync_stats();
}

void StagedCommunicator::send(const void* buf, size_t count, CommDType t, int peer, int tag) {
  Staged b(*this, buf, count * comm_dtype_size(t));
  b.copy_in();
  inner_->send(b.host(), count, t, peer, tag);
  sync_stats();
}

void StagedCommunicator::recv(void* buf, size_t count, CommDType t, int peer, int tag) {
  Staged b(*this, buf, count * comm_dtype_size(t));
  inner_->recv(b.host(), count, t, peer, tag);
  b.copy_out();
  sync_stats();
}

std::unique_ptr<CommRequest> StagedCommunicator::isend(const void* buf, size_t count, CommDType t, int peer, int tag) {
  Staged b(*this, buf, count * comm_dtype_size(t));
  b.copy_in();
  std::unique_ptr<CommRequest> r = inner_->isend(b.host(), count, t, peer, tag);
  sync_stats();
  if (!b.device()) return std::make_unique<StagedRequest>(*this, std::move(r), Staging{}, nullptr, 0);
  return std::make_unique<StagedRequest>(*this, std::move(r), b.take(), nullptr, 0);
}

std::unique_ptr<CommRequest> StagedCommunicator::irecv(void* buf, size_t count, CommDType t, int peer, int tag) {
  const size_t bytes = count * comm_dtype_size(t);
  Staged b(*this, buf, bytes);
  std::unique_ptr<CommRequest> r = inner_->irecv(b.host(), count, t, peer, tag);
  sync_stats();
  if (!b.device()) return std::make_unique<StagedRequest>(*this, std::move(r), Staging{}, nullptr, 0);
  return std::make_unique<StagedRequest>(*this, std::move(r), b.take(), buf, bytes);
}

void StagedCommunicator::send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count,
                                   int source, CommDType t, int tag) {
  const size_t es = comm_dtype_size(t);
  Staged s(*this, send, send_count * es), r(*this, recv, recv_count * es);
  s.copy_in();
  inner_->send_recv(s.host(), send_count, dest, r.host(), recv_count, source, t, tag);
  r.copy_out();
  sync_stats();
}

void StagedCommunicator::barrier() {
  inner_->barrier();
  sync_stats();
}

}  // namespace shardlm
