// Communicator over NCCL for device buffers; host buffers go over MPI. NCCL builds only.
//
// Construction is collective over the members: an inner MpiCommunicator over the same members
// carries the bootstrap (group rank 0 makes the ncclUniqueId, a broadcast hands it to all) and
// every host-memory call afterwards; then each member joins the NCCL communicator on its current
// CUDA device (the process binds its GPU before: gpu_binding.h) as a nonblocking communicator,
// waiting for the init with the same deadline as every operation.
//
// Each call looks at its buffers (cudaPointerGetAttributes): device or managed memory goes to NCCL
// on this communicator's own stream, host memory to the inner MPI communicator, so
// lockstep flags, headers and host vectors keep working. Rules for callers:
//  - every member passes the same kind of memory to a call (else one side runs NCCL, the other MPI,
//    and the call times out); pass the device pointers even for zero counts (a null pointer says
//    nothing and a call whose pointers are all null goes to MPI);
//  - one call does not mix host and device buffers: that fails with an Error naming both (staging
//    the host side would hide a slow path in the middle of the hot loop);
//  - the stream is a blocking one: it is ordered after the work already on the legacy default
//    stream (where CudaBackend runs its kernels), and that stream's later work waits for it, so
//    activations written by the backend need no synchronisation; inputs written on other
//    (non-blocking) streams must be ready when the call is made. Outputs are complete when the call
//    returns (isend/irecv: when wait() returns);
//  - NCCL matches point-to-point messages between a pair in issue order, tags are ignored, and a
//    posted irecv blocks this communicator's stream until its message arrives: do not post a
//    receive before a send that its peer waits for (pipeline groups stay on MPI for this reason).
// Every wait polls the stream and ncclCommGetAsyncError against the deadline; an asynchronous
// error or the deadline aborts the NCCL communicator (ncclCommAbort) and throws Error naming the
// operation, the group, this rank, its world rank and host, and the NCCL error text. An aborted
// communicator refuses further device calls.
#pragma once

#ifdef SHARDLM_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm_mpi.h"
#include "parallel/communicator.h"
#include "parallel/deadline_wait.h"

namespace shardlm {

class NcclCommunicator final : public Communicator {
 public:
  // members: world ranks in group-rank order (as MpiCommunicator). timeout_s <= 0 waits forever.
  NcclCommunicator(const std::vector<int>& members, std::string name, double timeout_s);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  const std::string& name() const override { return mpi_->name(); }
  int world_rank_of(int r) const override { return mpi_->world_rank_of(r); }

  void all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t count, CommDType t) override;
  void reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) override;
  void all_to_all(const void* send, void* recv, size_t count, CommDType t) override;
  void all_to_allv(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                   void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                   CommDType t) override;
  void broadcast(void* buf, size_t count, CommDType t, int root) override;
  std::unique_ptr<CommRequest> isend(const void* buf, size_t count, CommDType t, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv(void* buf, size_t count, CommDType t, int peer, int tag) override;
  void send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count, int source,
                 CommDType t, int tag) override;
  void barrier() override;  // over MPI
  std::string transport() const override;  // "NCCL 2.21.5"
  std::shared_ptr<MemorySpace> device_memory() const override;
  // On `stream` without waiting (a step being captured); its completion is the stream's.
  bool can_enqueue() const override { return true; }
  void enqueue_all_reduce(void* buf, size_t count, CommDType t, ReduceOp op, void* stream) override;
  void enqueue_all_to_all(const void* send, void* recv, size_t count, CommDType t, void* stream) override;
  void wait_stream(void* stream, const char* op) override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  MpiCommunicator& host() { return *mpi_; }

 private:
  friend class NcclRequest;
  friend class NcclHostRequest;
  // True when the call's buffers are device memory (NCCL path), false for host (MPI path);
  // throws when they mix. Null pointers do not count.
  bool device_call(const char* op, std::initializer_list<std::pair<const char*, const void*>> bufs) const;
  // Runs a host-path call on the inner MPI communicator and adds its stats to ours.
  template <typename F>
  void on_host(F f);
  void check_usable(const char* op) const;
  void check_peer(int r, const char* op) const;
  // Throws (after aborting) unless r is ncclSuccess or ncclInProgress.
  void check_enqueue(ncclResult_t r, const char* op);
  // Until the communicator has taken the calls made so far (async state no longer in progress).
  void wait_enqueued(const char* op, const std::string& peers);
  // Until `stream` (default: the communicator's own) has finished everything queued on it.
  void wait_done(const char* op, const std::string& peers, cudaStream_t stream = nullptr);
  WaitContext context(const char* op, const std::string& peers) const;
  std::string nccl_text(ncclResult_t r) const;
  void abort_comm();
  std::string all_peers() const;
  std::string peer_text(int group_rank) const;
  template <typename Body>
  void grouped(const char* op, Body body);
  // all_to_all's sends and receives (blocks of count elements) queued on `stream`, in one group.
  void queue_all_to_all(const char* op, const void* send, void* recv, size_t count, CommDType t, cudaStream_t stream);

  std::unique_ptr<MpiCommunicator> mpi_;
  double timeout_s_;
  int world_rank_ = 0;
  std::string host_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
};

}  // namespace shardlm
#endif  // SHARDLM_HAVE_NCCL
