// A host communicator (MPI) that accepts device buffers: each device buffer is staged through
// host memory from the MemorySpace (pinned, reused between calls): inputs are copied in before
// the inner operation, outputs copied out after it. Host buffers pass straight through, so host
// control traffic costs nothing extra, and one call may mix host and device buffers.
//
// Only the elements an operation reads are copied in and only those it writes are copied out
// (all_to_allv: each received block alone), so the gaps of a device buffer stay untouched.
// irecv copies out in wait(); isend copies in before it returns. A request dropped without wait()
// keeps its staging memory (MPI may still write to it): the job is failing anyway.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/memory_space.h"

namespace shardlm {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<MemorySpace> memory);
  ~StagedCommunicator() override;
  StagedCommunicator(const StagedCommunicator&) = delete;
  StagedCommunicator& operator=(const StagedCommunicator&) = delete;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  int world_rank_of(int r) const override { return inner_->world_rank_of(r); }

  void all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t count, CommDType t) override;
  void reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) override;
  void all_to_all(const void* send, void* recv, size_t count, CommDType t) override;
  void all_to_allv(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                   void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                   CommDType t) override;
  void broadcast(void* buf, size_t count, CommDType t, int root) override;
  void send(const void* buf, size_t count, CommDType t, int peer, int tag) override;
  void recv(void* buf, size_t count, CommDType t, int peer, int tag) override;
  std::unique_ptr<CommRequest> isend(const void* buf, size_t count, CommDType t, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv(void* buf, size_t count, CommDType t, int peer, int tag) override;
  void send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count, int source,
                 CommDType t, int tag) override;
  void barrier() override;
  std::string transport() const override { return inner_->transport(); }
  std::shared_ptr<MemorySpace> device_memory() const override { return memory_; }

  Communicator& inner() { return *inner_; }
  MemorySpace& memory() { return *memory_; }

  // A host staging buffer borrowed from the pool (public for the request type in the .cpp).
  struct Staging {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  Staging acquire(size_t bytes);
  void release(Staging s);
  // This communicator's figures are the inner one's (a request's wait adds its time there), and
  // its seconds include the staging copies: a copy from the device also waits for the kernels
  // queued before it, as a device communicator's call does.
  void sync_stats() {
    stats_ = inner_->stats();
    stats_.seconds += copy_seconds_;
  }
  // Times one staging copy into copy_seconds_.
  class CopyTime {
   public:
    explicit CopyTime(StagedCommunicator& c) : c_(c), t0_(std::chrono::steady_clock::now()) {}
    ~CopyTime() { c_.copy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
    CopyTime(const CopyTime&) = delete;
    CopyTime& operator=(const CopyTime&) = delete;

   private:
    StagedCommunicator& c_;
    std::chrono::steady_clock::time_point t0_;
  };

 private:
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<MemorySpace> memory_;
  double copy_seconds_ = 0;    // the staging copies' wall time, all calls
  std::vector<Staging> free_;  // staging buffers not in use, reused by size
};

}  // namespace shardlm
