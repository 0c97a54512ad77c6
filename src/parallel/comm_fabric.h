// Communicator over libfabric (`--comm fabric`): host buffers moved by tagged messages on one RDM
// endpoint per group (fabric_endpoint.h). On EFA this is the provider's own reliable datagram path,
// with no TCP and no MPI in the data path; locally it runs on tcp;ofi_rxm or shm.
//
// Construction is collective over the members: an inner MpiCommunicator over the same members
// carries the bootstrap and nothing else. Group rank 0 opens its endpoint first and broadcasts the
// provider it got, so that every member opens the same one: the one FI_PROVIDER names, else shm for
// a group on one node, else libfabric's first. Then the endpoint names are all-gathered and
// inserted into each member's address table.
//
// Every message's tag says what it is: point-to-point messages carry the caller's tag and the
// sender's group rank; collective ones a per-communicator sequence number (members make the same
// calls in the same order), a phase and the sender. So messages never match across operations, and
// receives can be posted before or after their sends arrive.
//
// The collectives are direct (every rank sends its piece straight to the rank that needs it): n - 1
// messages per rank per phase, which for the group sizes of a node (tp <= 8, the ep group of a few
// nodes) costs the same bytes as a ring with fewer latency steps. Reductions add the contributions
// in group-rank order 0, 1, ..., n - 1 on the rank that owns the block, whatever order they arrive
// in, so float results do not depend on timing. all_reduce is reduce-scatter then all-gather, or
// for small buffers one step of whole buffers to every peer (each rank reduces all of it, in the
// same order: the same bits); broadcast is a binomial tree; barrier is a dissemination barrier.
//
// Messages above the provider's maximum (or set_max_message_bytes, for tests) go as pieces under
// one tag; the provider's send-after-send order keeps them in sequence. A received length other
// than the one posted means the members disagree on a count, and fails the call naming the peer.
//
// Every wait has the communicator's deadline; a timeout or a failed completion throws Error naming
// the operation, the group, this rank, its world rank and host, and the peers still pending. The
// top level then aborts the job. A call that does not come back from libfabric at all (a shm send
// spinning on a lock a stopped peer holds) is ended by a CommWatchdog at twice the deadline, with
// the same message. Device buffers are staged by StagedCommunicator (comm_registry).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm_watchdog.h"
#include "parallel/communicator.h"

namespace shardlm {

class MpiCommunicator;
class FabricEndpoint;
struct FabricOp;

class FabricCommunicator final : public Communicator {
 public:
  // members: world ranks in group-rank order (as MpiCommunicator). timeout_s <= 0 waits forever.
  FabricCommunicator(const std::vector<int>& members, std::string name, double timeout_s);
  ~FabricCommunicator() override;
  FabricCommunicator(const FabricCommunicator&) = delete;
  FabricCommunicator& operator=(const FabricCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  int world_rank_of(int r) const override;

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
  void send_recv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count, int source, CommDType t,
                 int tag) override;
  void barrier() override;
  std::string transport() const override;

  // The provider, fabric and domain in use ("" for a group of one, which opens no endpoint).
  std::string provider() const;
  std::string fabric() const;
  std::string domain() const;
  // Largest message handed to the provider in one piece; every member must set the same. Tests
  // lower it to drive the piece path with small buffers.
  void set_max_message_bytes(size_t n);
  // Registers every message buffer with the provider, as for one that insists on FI_MR_LOCAL, on
  // providers that do not: tests drive that path with tcp and shm. Local to this rank.
  void register_every_buffer();
  // all_reduce sends whole buffers to every peer in one step while (n - 1) x bytes stays at or
  // under this (default kOneShotBytes), reduce-scatter + all-gather above. Every member must set
  // the same; tests use it to drive both paths.
  static constexpr size_t kOneShotBytes = 32 << 10;
  void set_one_shot_bytes(size_t n);

  // Tags (exposed for tests): bit 63 marks collectives. Point-to-point: the caller's tag (31 bits)
  // above the sender's group rank (16 bits). Collective: sequence number (31 bits), phase (8 bits),
  // sender (16 bits).
  static uint64_t p2p_tag(int tag, int sender);
  static uint64_t collective_tag(uint32_t seq, int phase, int sender);

 private:
  class Batch;
  friend class FabricRequest;
  void wait(Batch& b, const char* op);
  void post_send(Batch& b, const void* buf, size_t bytes, int peer, uint64_t tag);
  void post_recv(Batch& b, void* buf, size_t bytes, int peer, uint64_t tag);
  // Rethrows an endpoint's refusal to post with the call, the group, this rank and the peer.
  [[noreturn]] void post_failed(const Batch& b, const char* direction, int peer, const Error& e) const;
  void check_peer(int r, const char* op) const;
  bool on_one_node();  // collective over the bootstrap communicator
  std::string peer_text(int group_rank) const;
  // The watchdog's abort message for a call to `op` that never came back from libfabric.
  std::string stuck_text(const char* op) const;
  // all_to_all(v) without the statistics: this rank's own block copied, one message per pair.
  void exchange(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs, CommDType t,
                const char* what);
  // Reduce-scatter: block q (offs[q], lens[q] elements of every rank's `in`) is reduced on rank q,
  // contributions taken in rank order; this rank's result goes to `out` (which may be its own block
  // of `in`). The first phase of all_reduce, and all of reduce_scatter.
  void reduce_blocks(const void* in, const std::vector<size_t>& offs, const std::vector<size_t>& lens, void* out,
                     CommDType t, ReduceOp op, const char* what, uint32_t seq);

  std::unique_ptr<MpiCommunicator> boot_;
  std::unique_ptr<FabricEndpoint> ep_;
  std::unique_ptr<CommWatchdog> watchdog_;  // ends the job if a call never returns from libfabric
  std::vector<int> members_;
  double timeout_s_;
  size_t max_piece_;
  size_t one_shot_bytes_ = kOneShotBytes;
  uint32_t seq_ = 0;
  std::vector<char> scratch_;
};

}  // namespace shardlm
