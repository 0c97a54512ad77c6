// One libfabric reliable-datagram (FI_EP_RDM) endpoint with tagged messaging: the transport under
// FabricCommunicator. On AWS this is the efa provider (the EFA-native path, no TCP); elsewhere
// whatever RDM provider libfabric lists first (tcp;ofi_rxm, shm, ...), or the one FI_PROVIDER
// names.
//
// What is asked of the provider, and why:
//  - FI_TAGGED: every message carries a 64-bit tag (FabricCommunicator puts the operation, its
//    sequence number and the sender's rank in it), so receives match by tag, never by arrival.
//  - FI_ORDER_SAS: sends to one peer arrive in the order posted, so a message split into pieces
//    under one tag lands piece by piece in the receives posted for it.
//  - modes FI_CONTEXT / FI_CONTEXT2: every operation passes its own fi_context2.
//  - mr_mode VIRT_ADDR | ALLOCATED | PROV_KEY, and LOCAL only where the provider insists: each
//    buffer is then registered for the life of its message (with keys of our own where the
//    provider does not choose them). efa's RDM endpoint does not insist (fi_efa(7)).
// Progress is driven by reading the completion queue (FI_PROGRESS_MANUAL providers need that);
// nothing else calls into libfabric behind the caller's back.
//
// Operations are owned here: a posted send or receive stays alive until its completion arrives,
// even when its owner gave up on it (a timeout), because the provider still holds its context.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

struct fi_info;
struct fid_fabric;
struct fid_domain;
struct fid_cq;
struct fid_av;
struct fid_ep;

namespace shardlm {

// One posted send or receive. Read-only for callers, between post and release.
struct FabricOp {
  bool done = false;
  bool is_send = false;
  int peer = 0;       // index into the address table (group rank)
  size_t bytes = 0;   // posted length
  size_t got = 0;     // receives: length of the message that matched
  std::string error;  // non-empty: the operation failed (provider's text)
};

class FabricEndpoint {
 public:
  // Opens provider `provider` ("" = libfabric's first RDM tagged provider, which honours
  // FI_PROVIDER). Throws Error naming the provider and libfabric's message when there is none.
  explicit FabricEndpoint(const std::string& provider);
  ~FabricEndpoint();
  FabricEndpoint(const FabricEndpoint&) = delete;
  FabricEndpoint& operator=(const FabricEndpoint&) = delete;

  const std::string& provider() const { return provider_; }  // "tcp;ofi_rxm", "efa", ...
  const std::string& fabric() const { return fabric_; }      // e.g. "efa-direct", "192.0.2.0/24"
  const std::string& domain() const { return domain_; }      // e.g. "rdmap16s27-rdm", "eth0"
  size_t max_message_bytes() const { return max_msg_; }
  bool registers_buffers() const { return mr_local_; }
  // Registers every buffer as if the provider asked for FI_MR_LOCAL (tests: neither tcp, shm nor
  // efa's RDM endpoint asks).
  void register_every_buffer() { mr_local_ = true; }
  std::vector<uint8_t> address() const;  // this endpoint's name (fi_getname)

  // Inserts the peers' addresses, index = peer number used by post_*. Called once.
  void insert_peers(const std::vector<std::vector<uint8_t>>& addresses);

  // Post a tagged send to `peer` / a receive of exactly `tag` from anyone (the tag names the
  // sender). Retries while the provider says try again (-FI_EAGAIN), progressing meanwhile, up to
  // `deadline_s` seconds (<= 0: forever); throws Error on failure. The buffer must stay untouched
  // until the op is done.
  FabricOp* post_send(const void* buf, size_t bytes, int peer, uint64_t tag, double deadline_s);
  FabricOp* post_recv(void* buf, size_t bytes, int peer, uint64_t tag, double deadline_s);

  // Reads the completion queue once, marking finished operations done (and failed ones with their
  // error). Returns the number of completions read.
  int progress();
  // Gives an op back; one still in flight is freed when its completion arrives (or at close).
  void release(FabricOp* op);

 private:
  struct Slot;  // FabricOp plus its fi_context2 and memory registration
  Slot* post(bool send, void* buf, size_t bytes, int peer, uint64_t tag, double deadline_s);
  void finish(Slot* s);
  void close_all();

  std::string provider_, fabric_, domain_;
  size_t max_msg_ = 0;
  bool mr_local_ = false;
  bool mr_prov_key_ = false;
  uint64_t next_key_ = 1;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_fid_ = nullptr;
  fid_domain* domain_fid_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::vector<uint64_t> peers_;  // fi_addr_t per peer
  std::unordered_set<Slot*> live_;
};

}  // namespace shardlm
