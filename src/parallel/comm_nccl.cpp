#include "parallel/comm_nccl.h"
#include "parallel/comm_stats_scope.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "core/error.h"
#include "parallel/memory_space.h"
#include "parallel/mpi_env.h"
#include "parallel/nccl_types.h"
#include "parallel/unique_id_exchange.h"

namespace shardlm {

static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes, "ncclUniqueId is not 128 bytes");

namespace {

using Clock = std::chrono::steady_clock;

using comm_detail::at;
using comm_detail::cat;
using comm_detail::StatScope;

bool ok_or_pending(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

}  // namespace

NcclCommunicator::NcclCommunicator(const std::vector<int>& members, std::string name, double timeout_s)
    : mpi_(std::make_unique<MpiCommunicator>(members, std::move(name), timeout_s)), timeout_s_(timeout_s) {
  world_rank_ = mpi_->world_rank_of(mpi_->rank());
  host_ = MpiEnv::initialized() ? MpiEnv::host() : "?";
  cudaError_t e = cudaGetDevice(&device_);
  SHARDLM_CHECK(e == cudaSuccess, "nccl communicator " << this->name() << " on world rank " << world_rank_ << " (host "
                                                       << host_ << "): cudaGetDevice failed: " << cudaGetErrorString(e));
  const UniqueIdBytes id_bytes = exchange_unique_id(*mpi_, [&]() {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    SHARDLM_CHECK(r == ncclSuccess, "ncclGetUniqueId for group " << this->name() << " on world rank " << world_rank_
                                                                 << " (host " << host_ << "): " << ncclGetErrorString(r)
                                                                 << " (" << ncclGetLastError(nullptr) << ")");
    UniqueIdBytes b;
    std::memcpy(b.data(), &id, sizeof id);
    return b;
  });
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof id);
  e = cudaStreamCreateWithFlags(&stream_, cudaStreamDefault);
  SHARDLM_CHECK(e == cudaSuccess, "nccl communicator " << this->name() << " on world rank " << world_rank_ << " (host "
                                                       << host_ << "): cudaStreamCreate failed: " << cudaGetErrorString(e));
  try {
    // Nonblocking: the init returns at once and is waited for below with a deadline, so a member
    // that never joins is reported instead of hanging the job.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_enqueue(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config), "ncclCommInitRankConfig");
    wait_enqueued("ncclCommInitRankConfig", all_peers());
  } catch (...) {
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  // Unwound by an error on this rank (a bad tensor, a failed step): the peers are not finalizing
  // with it, and finalize would wait for them up to the timeout before the job's abort names the
  // cause. Abort at once, as the other collective owners do while unwinding.
  if (comm_ != nullptr && !aborted_ && std::uncaught_exceptions() > 0) {
    ncclCommAbort(comm_);
    aborted_ = true;
  }
  if (comm_ != nullptr && !aborted_) {
    // Finalize flushes what is queued; bounded, then abort, since a destructor must not hang.
    bool ok = ok_or_pending(ncclCommFinalize(comm_));
    const double limit = timeout_s_ > 0 ? timeout_s_ : 60;
    const auto t0 = Clock::now();
    while (ok) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || !ok_or_pending(state)) ok = false;
      else if (state == ncclSuccess) break;
      else if (std::chrono::duration<double>(Clock::now() - t0).count() > limit) ok = false;
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (ok) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string NcclCommunicator::nccl_text(ncclResult_t r) const {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(aborted_ ? nullptr : comm_);
  if (last != nullptr && last[0] != '\0') s += std::string(" (") + last + ")";
  return s;
}

void NcclCommunicator::abort_comm() {
  if (comm_ != nullptr && !aborted_) ncclCommAbort(comm_);
  aborted_ = true;
}

WaitContext NcclCommunicator::context(const char* op, const std::string& peers) const {
  WaitContext c;
  c.op = op;
  c.group = name();
  c.rank = rank();
  c.world_rank = world_rank_;
  c.host = host_;
  c.timeout_s = timeout_s_;
  c.peers = peers;
  return c;
}

void NcclCommunicator::check_usable(const char* op) const {
  SHARDLM_CHECK(!aborted_, op << " on group " << name() << " (world rank " << world_rank_
                              << "): the NCCL communicator was aborted after an earlier error");
}

void NcclCommunicator::check_peer(int r, const char* op) const {
  SHARDLM_CHECK(r >= 0 && r < size(), op << " on group " << name() << ": peer " << r << " outside [0, " << size() << ")");
  SHARDLM_CHECK(r != rank(), op << " on group " << name() << ": peer " << r << " is this rank");
}

void NcclCommunicator::check_enqueue(ncclResult_t r, const char* op) {
  if (ok_or_pending(r)) return;
  const std::string text = nccl_text(r);
  abort_comm();
  SHARDLM_FAIL(op << " on group " << name() << " failed on rank " << rank() << " (world rank " << world_rank_
                  << ", host " << host_ << "): " << text << " (communicator aborted)");
}

void NcclCommunicator::wait_enqueued(const char* op, const std::string& peers) {
  wait_with_deadline(
      context(op, peers),
      [&]() -> PollResult {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) return {PollState::kFailed, "ncclCommGetAsyncError: " + nccl_text(r)};
        if (state == ncclInProgress) return {PollState::kPending, ""};
        if (state != ncclSuccess) return {PollState::kFailed, nccl_text(state)};
        return {PollState::kDone, ""};
      },
      [&]() { abort_comm(); });
}

void NcclCommunicator::wait_done(const char* op, const std::string& peers, cudaStream_t stream) {
  const cudaStream_t s = stream ? stream : stream_;
  wait_with_deadline(
      context(op, peers),
      [&]() -> PollResult {
        // The stream first, then the async error: an error raised while the stream drained (the
        // operation's own) is seen before the wait reports success.
        const cudaError_t e = cudaStreamQuery(s);
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) return {PollState::kFailed, "ncclCommGetAsyncError: " + nccl_text(r)};
        if (state == ncclInProgress) return {PollState::kPending, ""};  // not yet on the stream
        if (state != ncclSuccess) return {PollState::kFailed, nccl_text(state)};
        if (e == cudaSuccess) return {PollState::kDone, ""};
        if (e == cudaErrorNotReady) return {PollState::kPending, ""};
        cudaGetLastError();
        return {PollState::kFailed, std::string("cudaStreamQuery: ") + cudaGetErrorString(e)};
      },
      [&]() { abort_comm(); });
}

std::string NcclCommunicator::all_peers() const {
  std::string s = size() == 2 ? "world rank " : "world ranks ";
  bool first = true;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    if (!first) s += ", ";
    s += std::to_string(world_rank_of(r));
    first = false;
  }
  return s;
}

std::string NcclCommunicator::transport() const {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess || v <= 0) return "NCCL (no version: the emulation over MPI)";
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::shared_ptr<MemorySpace> NcclCommunicator::device_memory() const { return cuda_memory_space(); }

std::string NcclCommunicator::peer_text(int group_rank) const {
  return "world rank " + std::to_string(world_rank_of(group_rank)) + " (group rank " + std::to_string(group_rank) + ")";
}

bool NcclCommunicator::device_call(const char* op,
                                   std::initializer_list<std::pair<const char*, const void*>> bufs) const {
  const MemorySpace& mem = *cuda_memory_space();
  const char* device_name = nullptr;
  const char* host_name = nullptr;
  for (const auto& [label, p] : bufs) {
    if (p == nullptr) continue;
    if (mem.is_device(p)) device_name = label;
    else host_name = label;
  }
  SHARDLM_CHECK(device_name == nullptr || host_name == nullptr,
                op << " on group " << name() << " (world rank " << world_rank_ << "): the " << device_name
                   << " buffer is device memory but the " << host_name
                   << " buffer is host memory; the nccl communicator needs all buffers of one call on the same side "
                      "(device: NCCL, host: MPI)");
  return device_name != nullptr;
}

template <typename F>
void NcclCommunicator::on_host(F f) {
  const CommStats before = mpi_->stats();
  f();
  const CommStats& after = mpi_->stats();
  stats_.calls += after.calls - before.calls;
  stats_.bytes_sent += after.bytes_sent - before.bytes_sent;
  stats_.seconds += after.seconds - before.seconds;
}

// Runs body (NCCL calls returning the first failure, or ncclSuccess) inside one NCCL group, so that
// its sends and receives progress together; the group is always closed.
template <typename Body>
void NcclCommunicator::grouped(const char* op, Body body) {
  check_enqueue(ncclGroupStart(), op);
  const ncclResult_t first = body();
  const ncclResult_t end = ncclGroupEnd();
  check_enqueue(ok_or_pending(first) ? end : first, op);
}

void NcclCommunicator::all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) {
  if (!device_call("all_reduce", {{"reduction", buf}})) return on_host([&] { mpi_->all_reduce(buf, count, t, op); });
  check_usable("all_reduce");
  StatScope st(stats_, size() > 1 ? count * comm_dtype_size(t) : 0);
  check_enqueue(ncclAllReduce(buf, buf, count, nccl_dtype(t), nccl_op(op), comm_, stream_), "all_reduce");
  wait_done("all_reduce", all_peers());
}

void NcclCommunicator::wait_stream(void* stream, const char* op) {
  check_usable(op);
  // A null stream is the legacy default stream the caller queued on (a graph launched there),
  // not this communicator's own, which wait_done takes null for.
  wait_done(op, all_peers(), stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy);
}

void NcclCommunicator::enqueue_all_reduce(void* buf, size_t count, CommDType t, ReduceOp op, void* stream) {
  SHARDLM_CHECK(device_call("enqueue_all_reduce", {{"reduction", buf}}) || count == 0,
                "enqueue_all_reduce on group " << name()
                                               << ": the buffer is host memory; only device memory can be "
                                                  "queued on a stream");
  check_usable("enqueue_all_reduce");
  StatScope st(stats_, size() > 1 ? count * comm_dtype_size(t) : 0);
  check_enqueue(ncclAllReduce(buf, buf, count, nccl_dtype(t), nccl_op(op), comm_, static_cast<cudaStream_t>(stream)),
                "enqueue_all_reduce");
  wait_enqueued("enqueue_all_reduce", all_peers());  // taken by the communicator, not completed
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t count, CommDType t) {
  if (!device_call("all_gather", {{"send", send}, {"receive", recv}}))
    return on_host([&] { mpi_->all_gather(send, recv, count, t); });
  check_usable("all_gather");
  StatScope st(stats_, size() > 1 ? count * comm_dtype_size(t) : 0);
  check_enqueue(ncclAllGather(send, recv, count, nccl_dtype(t), comm_, stream_), "all_gather");
  wait_done("all_gather", all_peers());
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) {
  if (!device_call("reduce_scatter", {{"send", send}, {"receive", recv}}))
    return on_host([&] { mpi_->reduce_scatter(send, recv, count, t, op); });
  check_usable("reduce_scatter");
  StatScope st(stats_, size() > 1 ? static_cast<size_t>(size()) * count * comm_dtype_size(t) : 0);
  check_enqueue(ncclReduceScatter(send, recv, count, nccl_dtype(t), nccl_op(op), comm_, stream_), "reduce_scatter");
  wait_done("reduce_scatter", all_peers());
}

void NcclCommunicator::all_to_all(const void* send, void* recv, size_t count, CommDType t) {
  if (!device_call("all_to_all", {{"send", send}, {"receive", recv}}))
    return on_host([&] { mpi_->all_to_all(send, recv, count, t); });
  check_usable("all_to_all");
  StatScope st(stats_, size() > 1 ? static_cast<size_t>(size()) * count * comm_dtype_size(t) : 0);
  queue_all_to_all("all_to_all", send, recv, count, t, stream_);
  wait_done("all_to_all", all_peers());
}

void NcclCommunicator::queue_all_to_all(const char* op, const void* send, void* recv, size_t count, CommDType t,
                                        cudaStream_t stream) {
  const size_t es = comm_dtype_size(t), n = static_cast<size_t>(size());
  const ncclDataType_t dt = nccl_dtype(t);
  // Block p to rank p and from rank p, this rank included (NCCL pairs a send and a receive to
  // oneself inside a group).
  grouped(op, [&]() {
    for (size_t p = 0; p < n; ++p) {
      ncclResult_t r = ncclSend(cat(send, p * count, es), count, dt, static_cast<int>(p), comm_, stream);
      if (!ok_or_pending(r)) return r;
      r = ncclRecv(at(recv, p * count, es), count, dt, static_cast<int>(p), comm_, stream);
      if (!ok_or_pending(r)) return r;
    }
    return ncclSuccess;
  });
}

void NcclCommunicator::enqueue_all_to_all(const void* send, void* recv, size_t count, CommDType t, void* stream) {
  SHARDLM_CHECK(device_call("enqueue_all_to_all", {{"send", send}, {"receive", recv}}) || count == 0,
                "enqueue_all_to_all on group " << name()
                                               << ": the buffers are host memory; only device memory can be "
                                                  "queued on a stream");
  check_usable("enqueue_all_to_all");
  StatScope st(stats_, size() > 1 ? static_cast<size_t>(size()) * count * comm_dtype_size(t) : 0);
  queue_all_to_all("enqueue_all_to_all", send, recv, count, t, static_cast<cudaStream_t>(stream));
  wait_enqueued("enqueue_all_to_all", all_peers());  // taken by the communicator, not completed
}

void NcclCommunicator::all_to_allv(const void* send, const std::vector<size_t>& send_counts,
                                   const std::vector<size_t>& send_displs, void* recv,
                                   const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                                   CommDType t) {
  if (!device_call("all_to_allv", {{"send", send}, {"receive", recv}})) {
    return on_host(
        [&] { mpi_->all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t); });
  }
  check_usable("all_to_allv");
  const size_t n = static_cast<size_t>(size());
  SHARDLM_CHECK(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n && recv_displs.size() == n,
                "all_to_allv on group " << name() << ": counts and displacements need " << n << " entries each");
  const size_t es = comm_dtype_size(t);
  size_t total = 0;
  for (size_t c : send_counts) total += c;
  StatScope st(stats_, size() > 1 ? total * es : 0);
  const ncclDataType_t dt = nccl_dtype(t);
  // Empty blocks are skipped on both sides: rank a's send count to b is b's receive count from a.
  grouped("all_to_allv", [&]() {
    for (size_t p = 0; p < n; ++p) {
      if (send_counts[p] > 0) {
        const ncclResult_t r =
            ncclSend(cat(send, send_displs[p], es), send_counts[p], dt, static_cast<int>(p), comm_, stream_);
        if (!ok_or_pending(r)) return r;
      }
      if (recv_counts[p] > 0) {
        const ncclResult_t r =
            ncclRecv(at(recv, recv_displs[p], es), recv_counts[p], dt, static_cast<int>(p), comm_, stream_);
        if (!ok_or_pending(r)) return r;
      }
    }
    return ncclSuccess;
  });
  wait_done("all_to_allv", all_peers());
}

void NcclCommunicator::broadcast(void* buf, size_t count, CommDType t, int root) {
  SHARDLM_CHECK(root >= 0 && root < size(), "broadcast on group " << name() << ": root " << root << " outside [0, "
                                                                  << size() << ")");
  if (!device_call("broadcast", {{"broadcast", buf}})) return on_host([&] { mpi_->broadcast(buf, count, t, root); });
  check_usable("broadcast");
  StatScope st(stats_, size() > 1 && root == rank() ? count * comm_dtype_size(t) : 0);
  check_enqueue(ncclBroadcast(buf, buf, count, nccl_dtype(t), root, comm_, stream_), "broadcast");
  wait_done("broadcast", rank() == root ? all_peers() : "root " + peer_text(root));
}

// A send or receive queued on the stream; wait() waits for the stream (so also for whatever was
// queued before it).
class NcclRequest final : public CommRequest {
 public:
  NcclRequest(NcclCommunicator& c, const char* op, std::string peers) : c_(c), op_(op), peers_(std::move(peers)) {}
  void wait() override {
    if (done_) return;
    comm_detail::WaitScope w(c_.stats_);
    c_.wait_done(op_, peers_);
    done_ = true;
  }

 private:
  NcclCommunicator& c_;
  const char* op_;
  std::string peers_;
  bool done_ = false;
};

// A send or receive of host memory, made by the MPI communicator: its wait counts here too.
class NcclHostRequest final : public CommRequest {
 public:
  NcclHostRequest(NcclCommunicator& c, std::unique_ptr<CommRequest> inner) : c_(c), inner_(std::move(inner)) {}
  void wait() override {
    if (!inner_) return;
    c_.on_host([&] { inner_->wait(); });
    inner_.reset();
  }

 private:
  NcclCommunicator& c_;
  std::unique_ptr<CommRequest> inner_;
};

std::unique_ptr<CommRequest> NcclCommunicator::isend(const void* buf, size_t count, CommDType t, int peer, int tag) {
  check_peer(peer, "send");
  if (!device_call("send", {{"send", buf}})) {
    std::unique_ptr<CommRequest> r;
    on_host([&] { r = mpi_->isend(buf, count, t, peer, tag); });
    return std::make_unique<NcclHostRequest>(*this, std::move(r));
  }
  check_usable("send");
  StatScope st(stats_, count * comm_dtype_size(t));
  // An empty message (a pipeline's empty lockstep step) posts nothing: both sides know the count.
  if (count > 0) check_enqueue(ncclSend(buf, count, nccl_dtype(t), peer, comm_, stream_), "send");
  const std::string peers = "receiver " + peer_text(peer);
  wait_enqueued("send", peers);  // a nonblocking communicator takes no new call while one is in progress
  return std::make_unique<NcclRequest>(*this, "send", peers);
}

std::unique_ptr<CommRequest> NcclCommunicator::irecv(void* buf, size_t count, CommDType t, int peer, int tag) {
  check_peer(peer, "recv");
  if (!device_call("recv", {{"receive", buf}})) {
    std::unique_ptr<CommRequest> r;
    on_host([&] { r = mpi_->irecv(buf, count, t, peer, tag); });
    return std::make_unique<NcclHostRequest>(*this, std::move(r));
  }
  check_usable("recv");
  StatScope st(stats_, 0);
  if (count > 0) check_enqueue(ncclRecv(buf, count, nccl_dtype(t), peer, comm_, stream_), "recv");
  const std::string peers = "sender " + peer_text(peer);
  wait_enqueued("recv", peers);
  return std::make_unique<NcclRequest>(*this, "recv", peers);
}

void NcclCommunicator::send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count,
                                 int source, CommDType t, int tag) {
  check_peer(dest, "send_recv");
  check_peer(source, "send_recv");
  if (!device_call("send_recv", {{"send", send}, {"receive", recv}})) {
    return on_host([&] { mpi_->send_recv(send, send_count, dest, recv, recv_count, source, t, tag); });
  }
  check_usable("send_recv");
  const ncclDataType_t dt = nccl_dtype(t);
  StatScope st(stats_, send_count * comm_dtype_size(t));
  // One group, so that a ring of send_recv calls cannot deadlock.
  grouped("send_recv", [&]() {
    const ncclResult_t r = ncclSend(send, send_count, dt, dest, comm_, stream_);
    if (!ok_or_pending(r)) return r;
    return ncclRecv(recv, recv_count, dt, source, comm_, stream_);
  });
  wait_done("send_recv", "receiver " + peer_text(dest) + ", sender " + peer_text(source));
}

void NcclCommunicator::barrier() {
  on_host([&] { mpi_->barrier(); });
}

}  // namespace shardlm
