// Communicator: collectives and point-to-point over one group of ranks (a tensor-parallel group,
// pipeline neighbours, a replica, the world). Backends: MPI (comm_mpi.h), NCCL (comm_nccl.h) and
// libfabric (comm_fabric.h), behind this same interface, registered in comm_registry.cpp.
//
// Every wait has a deadline (timeout_s): when a peer does not answer in time the call throws
// Error naming the group, this rank and the peer(s) still missing, and the top level aborts the
// whole job. Buffers are backend memory (host memory for MPI).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardlm {

class MemorySpace;  // parallel/memory_space.h

enum class ReduceOp { kSum, kMax, kMin };
// kBF16: 16-bit patterns (bf16 rows on the wire, arch/expert_wire.h), moved but never reduced.
enum class CommDType { kF32, kI32, kI64, kU8, kBF16 };
size_t comm_dtype_size(CommDType t);

struct CommStats {
  uint64_t bytes_sent = 0;  // payload bytes this rank sent (collectives: its contribution)
  uint64_t calls = 0;
  double seconds = 0;       // wall time inside calls
};

// A pending nonblocking send or receive. wait() completes it within the communicator's timeout
// (throwing Error naming the peer otherwise); the buffer must stay untouched until then.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank inside the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "tp(replica 0, stage 1)"
  // World rank of group rank r (for messages that name a peer).
  virtual int world_rank_of(int r) const = 0;

  virtual void all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) = 0;  // in place
  // recv holds size() blocks of count elements, block r from group rank r.
  virtual void all_gather(const void* send, void* recv, size_t count, CommDType t) = 0;
  // send holds size() blocks of count elements; recv gets the reduction of block rank().
  virtual void reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) = 0;
  // Block r of send goes to rank r; block r of recv comes from rank r (count elements each).
  virtual void all_to_all(const void* send, void* recv, size_t count, CommDType t) = 0;
  // Variable sizes: counts and displacements in elements, one per rank.
  virtual void all_to_allv(const void* send, const std::vector<size_t>& send_counts,
                           const std::vector<size_t>& send_displs, void* recv,
                           const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                           CommDType t) = 0;
  virtual void broadcast(void* buf, size_t count, CommDType t, int root) = 0;
  // Blocking forms; by default the nonblocking ones waited for.
  virtual void send(const void* buf, size_t count, CommDType t, int peer, int tag) {
    isend(buf, count, t, peer, tag)->wait();
  }
  virtual void recv(void* buf, size_t count, CommDType t, int peer, int tag) {
    irecv(buf, count, t, peer, tag)->wait();
  }
  // Nonblocking forms, for pipelines: post early, overlap with compute, wait later.
  virtual std::unique_ptr<CommRequest> isend(const void* buf, size_t count, CommDType t, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(void* buf, size_t count, CommDType t, int peer, int tag) = 0;
  // Sends to `dest` and receives from `source` at the same time (a ring step, a pipeline shift),
  // so that every rank of a ring can do both without deadlock. send_count must equal the count the
  // matching receiver passes (likewise for send/recv), peers must differ from rank().
  virtual void send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count, int source,
                         CommDType t, int tag) = 0;
  virtual void barrier() = 0;
  // What carries the bytes, for run headers ("libfabric tcp;ofi_rxm (fabric 192.0.2.0/24, domain
  // eth0)"); "" where the backend name says it all.
  virtual std::string transport() const { return ""; }
  // The memory whose buffers this backend moves itself (NCCL: CUDA device memory), for callers
  // that must allocate such buffers (shardlm bench-comm); null for host-memory backends.
  virtual std::shared_ptr<MemorySpace> device_memory() const { return nullptr; }

  // For steps captured as CUDA graphs: queues an in-place all-reduce of device memory on `stream`
  // (a cudaStream_t, the one being captured) and returns without waiting for it, so the capture
  // records it and every replay runs it. Only where can_enqueue() (NCCL); the others throw.
  virtual bool can_enqueue() const { return false; }
  virtual void enqueue_all_reduce(void* buf, size_t count, CommDType t, ReduceOp op, void* stream);
  // The same for all_to_all (blocks of count elements, device memory): a captured expert-parallel
  // MoE layer's fixed-capacity exchange (arch/expert_exchange.h).
  virtual void enqueue_all_to_all(const void* send, void* recv, size_t count, CommDType t, void* stream);
  // Until `stream` (a cudaStream_t) has run what is queued on it, a replayed graph's collectives
  // among them: under this communicator's deadline, its asynchronous errors polled, the
  // communicator aborted and an Error naming the group and peers thrown on either. A replayed
  // step waits here before reading anything back, so a failed peer or link ends the job instead
  // of blocking it in a plain stream synchronize. Communicators that queue nothing on streams wait
  // for nothing.
  virtual void wait_stream(void* stream, const char* op) {}
  // Counts what a replayed graph moved (its calls and bytes, as they were at capture) in stats().
  void count_replayed(const CommStats& per_replay) {
    stats_.calls += per_replay.calls;
    stats_.bytes_sent += per_replay.bytes_sent;
  }

  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
};

// Creates the communicator of `members` (world ranks, in group-rank order; this rank must be one
// of them) on backend `backend` ("mpi"). Collective over `members` only: every member calls it
// with the same list; other ranks do not take part.
std::unique_ptr<Communicator> make_communicator(const std::string& backend, const std::vector<int>& members,
                                                const std::string& name, double timeout_s);
std::vector<std::string> comm_backend_names();

// Makes `name` (a new one, or one of the table's) use `factory` from now on. For programs whose
// "nccl" is the emulated NCCL over the emulated CUDA runtime (see src/parallel/CMakeLists.txt).
using CommFactory = std::unique_ptr<Communicator> (*)(const std::vector<int>& members, const std::string& name,
                                                      double timeout_s);
void override_communicator(const std::string& name, CommFactory factory);

// The memory the host-memory communicators (mpi, fabric) stage device buffers through, or null
// where there are none to stage: by default CUDA memory where the runtime sees a GPU. Programs over
// the emulated CUDA runtime, whose GPUs the real runtime does not see, name theirs here.
using StagingMemory = std::shared_ptr<MemorySpace> (*)();
void override_staging_memory(StagingMemory staging);

}  // namespace shardlm
