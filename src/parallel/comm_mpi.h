// Communicator over MPI (host memory). The group is made with MPI_Group_incl +
// MPI_Comm_create_group, collective over the members only. Every operation is started in its
// nonblocking form and waited for with an MPI_Test loop bounded by the communicator's timeout
// (spin with sched_yield for a short while, then sleep in short steps so that an idle wait does
// not hold a core); on timeout the call throws Error naming the operation, the group, this rank,
// its host and the peers.
//
// Counts above INT_MAX (MPI's int counts) are handled: reductions, broadcasts and point-to-point
// messages are split into pieces; gathers and all-to-all use a derived datatype that covers a
// whole block (MPI_Type_vector + remainder). all_to_allv first agrees on whether any rank needs
// 64-bit counts or displacements (a 4-byte all_reduce) and then uses MPI_Ialltoallv, or
// MPI_Ialltoallw with one derived type per peer.
//
// A group of one rank makes no MPI calls at all (it also works without MPI_Init): collectives
// copy where needed, barrier returns at once. Sending to oneself is refused.
//
// After a timeout the pending MPI request is abandoned (MPI cannot cancel a collective): the caller
// is expected to let the error reach the top level, which aborts the job.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace shardlm {

class MpiCommunicator final : public Communicator {
 public:
  // members: world ranks in group-rank order, no duplicates, this rank among them. timeout_s <= 0
  // waits forever.
  MpiCommunicator(const std::vector<int>& members, std::string name, double timeout_s);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::string& name() const override { return name_; }
  int world_rank_of(int r) const override;

  void all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t count, CommDType t) override;
  void reduce_scatter(const void* send, void* recv, size_t count, CommDType t, ReduceOp op) override;
  void all_to_all(const void* send, void* recv, size_t count, CommDType t) override;
  void all_to_allv(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                   void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                   CommDType t) override;
  void broadcast(void* buf, size_t count, CommDType t, int root) override;
  void send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count, int source,
                 CommDType t, int tag) override;
  void barrier() override;

  MPI_Comm comm() const { return comm_; }  // MPI_COMM_NULL for a group of one
  double timeout_s() const { return timeout_s_; }
  // Largest element count passed to one MPI call (default INT_MAX). Tests lower it to exercise
  // the piece-splitting and big-datatype paths with small buffers; every member must set the same.
  void set_max_count_per_call(size_t n);
  std::unique_ptr<CommRequest> isend(const void* buf, size_t count, CommDType t, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv(void* buf, size_t count, CommDType t, int peer, int tag) override;

  // The MPI_Comm_create_group tag for a member list: a hash of the sorted list, below tag_ub.
  static int group_tag(const std::vector<int>& members, int tag_ub);

 private:
  // Waits for all of reqs; throws the timeout Error "<op> on group ... peers: <peers>".
  void wait_all(std::vector<MPI_Request>& reqs, const char* op, const std::string& peers);
  friend class MpiRequest;
  template <typename Post>
  std::unique_ptr<CommRequest> post_pieces(size_t count, size_t es, const char* op, std::string peers, Post post);
  std::string all_peers() const;  // "world ranks a, b, c" (every member but this rank)
  std::string peer_text(int group_rank) const;
  void check_peer(int r, const char* op) const;
  void check_mpi(int rc, const char* what) const;  // throws Error with MPI's message

  std::vector<int> members_;
  std::string name_;
  double timeout_s_;
  int rank_ = 0;
  int world_rank_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  size_t max_count_;
};

}  // namespace shardlm
