#include "parallel/fabric_endpoint.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace shardlm {

// The provider hands &ctx.fi back as op_context; fi comes first in the standard-layout Context, so
// that pointer is the Context's.
struct FabricEndpoint::Slot : FabricOp {
  struct Context {
    fi_context2 fi;
    Slot* self;
  } ctx{};
  fid_mr* mr = nullptr;
  bool released = false;
};

namespace {

constexpr uint64_t kMrModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;

std::string fi_text(int rc) { return std::string(fi_strerror(rc < 0 ? -rc : rc)) + " (" + std::to_string(rc) + ")"; }

// fi_getinfo for an RDM endpoint with tagged, send-ordered messages from `provider` ("" = any);
// `local`: whether we offer to register buffers (FI_MR_LOCAL). Returns the rc; *info on success.
int query(const std::string& provider, bool local, fi_info** info) {
  fi_info* hints = fi_allocinfo();
  SHARDLM_CHECK(hints, "libfabric: fi_allocinfo failed");
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(local ? kMrModes : kMrModes & ~uint64_t{FI_MR_LOCAL});
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());  // freed by fi_freeinfo
  const int rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, info);
  fi_freeinfo(hints);
  return rc;
}

}  // namespace

FabricEndpoint::FabricEndpoint(const std::string& provider) {
  // First in libfabric's order with registration offered, so that no provider is passed over for
  // wanting it; then that same provider without it, which it takes if it can (efa's RDM endpoint
  // registers for itself: fi_efa(7)), sparing a registration per message.
  const int rc = query(provider, true, &info_);
  if (rc != 0 || !info_) {
    const char* env = std::getenv("FI_PROVIDER");
    const uint32_t v = fi_version();
    SHARDLM_FAIL("libfabric " << FI_MAJOR(v) << "." << FI_MINOR(v) << ": no provider "
                              << (provider.empty() ? std::string("") : "'" + provider + "' ")
                              << "offers a reliable-datagram endpoint with tagged, send-ordered messages"
                              << (env ? std::string(" (FI_PROVIDER=") + env + ")" : std::string(""))
                              << ": fi_getinfo: " << fi_text(rc) << "; `fi_info -t FI_EP_RDM` lists what there is");
  }
  if (info_->domain_attr->mr_mode & FI_MR_LOCAL) {
    fi_info* plain = nullptr;
    if (query(info_->fabric_attr->prov_name, false, &plain) == 0 && plain) {
      fi_freeinfo(info_);
      info_ = plain;
    }
  }
  provider_ = info_->fabric_attr->prov_name ? info_->fabric_attr->prov_name : "?";
  fabric_ = info_->fabric_attr->name ? info_->fabric_attr->name : "?";
  domain_ = info_->domain_attr->name ? info_->domain_attr->name : "?";
  max_msg_ = info_->ep_attr->max_msg_size;
  mr_local_ = (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
  mr_prov_key_ = (info_->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;

  auto check = [&](int r, const char* what) {
    if (r == 0) return;
    close_all();
    SHARDLM_FAIL("libfabric provider " << provider_ << " (fabric " << fabric_ << ", domain " << domain_ << "): " << what
                                       << ": " << fi_text(r));
  };
  check(fi_fabric(info_->fabric_attr, &fabric_fid_, nullptr), "fi_fabric");
  check(fi_domain(fabric_fid_, info_, &domain_fid_, nullptr), "fi_domain");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;
  check(fi_cq_open(domain_fid_, &cq_attr, &cq_, nullptr), "fi_cq_open");
  fi_av_attr av_attr{};
  av_attr.type = info_->domain_attr->av_type == FI_AV_UNSPEC ? FI_AV_TABLE : info_->domain_attr->av_type;
  check(fi_av_open(domain_fid_, &av_attr, &av_, nullptr), "fi_av_open");
  check(fi_endpoint(domain_fid_, info_, &ep_, nullptr), "fi_endpoint");
  check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  check(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
  check(fi_enable(ep_), "fi_enable");
}

FabricEndpoint::~FabricEndpoint() { close_all(); }

void FabricEndpoint::close_all() {
  // The endpoint first: it stops the provider touching the contexts and buffers of operations still
  // in flight; then their registrations and memory.
  if (ep_) fi_close(&ep_->fid);
  ep_ = nullptr;
  for (Slot* s : live_) {
    if (s->mr) fi_close(&s->mr->fid);
    delete s;
  }
  live_.clear();
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_fid_) fi_close(&domain_fid_->fid);
  if (fabric_fid_) fi_close(&fabric_fid_->fid);
  av_ = nullptr;
  cq_ = nullptr;
  domain_fid_ = nullptr;
  fabric_fid_ = nullptr;
  if (info_) fi_freeinfo(info_);
  info_ = nullptr;
}

std::vector<uint8_t> FabricEndpoint::address() const {
  size_t len = 0;
  int rc = fi_getname(&ep_->fid, nullptr, &len);
  SHARDLM_CHECK(rc == -FI_ETOOSMALL || rc == 0, "libfabric provider " << provider_ << ": fi_getname: " << fi_text(rc));
  std::vector<uint8_t> addr(len);
  rc = fi_getname(&ep_->fid, addr.data(), &len);
  SHARDLM_CHECK(rc == 0, "libfabric provider " << provider_ << ": fi_getname: " << fi_text(rc));
  addr.resize(len);
  return addr;
}

void FabricEndpoint::insert_peers(const std::vector<std::vector<uint8_t>>& addresses) {
  SHARDLM_CHECK(peers_.empty(), "libfabric endpoint: peers inserted twice");
  peers_.resize(addresses.size());
  // One at a time: fi_av_insert takes a packed array of equal-sized names, and a name's size is the
  // provider's business.
  for (size_t i = 0; i < addresses.size(); ++i) {
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    const int n = fi_av_insert(av_, addresses[i].data(), 1, &a, 0, nullptr);
    SHARDLM_CHECK(n == 1 && a != FI_ADDR_NOTAVAIL, "libfabric provider "
                                                       << provider_ << ": fi_av_insert of peer " << i
                                                       << " failed: " << fi_text(n < 0 ? n : -FI_EINVAL));
    peers_[i] = a;
  }
}

FabricEndpoint::Slot* FabricEndpoint::post(bool send, void* buf, size_t bytes, int peer, uint64_t tag,
                                           double deadline_s) {
  SHARDLM_CHECK(peer >= 0 && static_cast<size_t>(peer) < peers_.size(),
                "libfabric endpoint: peer " << peer << " has no address");
  SHARDLM_CHECK(bytes <= max_msg_,
                "libfabric endpoint: message of " << bytes << " bytes above the provider's maximum " << max_msg_);
  auto* s = new Slot{};
  s->ctx.self = s;
  s->is_send = send;
  s->peer = peer;
  s->bytes = bytes;
  live_.insert(s);
  void* desc = nullptr;
  if (mr_local_ && bytes > 0) {
    // Without FI_MR_PROV_KEY the application picks the keys, unique within the domain.
    const uint64_t key = mr_prov_key_ ? 0 : next_key_++;
    const int rc = fi_mr_reg(domain_fid_, buf, bytes, send ? FI_SEND : FI_RECV, 0, key, 0, &s->mr, nullptr);
    if (rc != 0) {
      live_.erase(s);
      delete s;
      SHARDLM_FAIL("libfabric provider " << provider_ << ": fi_mr_reg of " << bytes << " bytes: " << fi_text(rc));
    }
    desc = fi_mr_desc(s->mr);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const ssize_t rc = send ? fi_tsend(ep_, buf, bytes, desc, peers_[static_cast<size_t>(peer)], tag, &s->ctx.fi)
                            : fi_trecv(ep_, buf, bytes, desc, FI_ADDR_UNSPEC, tag, 0, &s->ctx.fi);
    if (rc == 0) return s;
    if (rc != -FI_EAGAIN) {
      finish(s);
      SHARDLM_FAIL("libfabric provider " << provider_ << ": " << (send ? "fi_tsend" : "fi_trecv") << " of " << bytes
                                         << " bytes: " << fi_text(static_cast<int>(rc)));
    }
    // Queue full: completing earlier operations frees room.
    if (progress() == 0) sched_yield();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (deadline_s > 0 && waited > deadline_s) {
      finish(s);
      SHARDLM_FAIL("libfabric provider " << provider_ << ": " << (send ? "fi_tsend" : "fi_trecv")
                                         << " still refused (queue full) after " << deadline_s << " s");
    }
  }
}

FabricOp* FabricEndpoint::post_send(const void* buf, size_t bytes, int peer, uint64_t tag, double deadline_s) {
  // libfabric's send takes a non-const pointer; it only reads it.
  return post(true, const_cast<void*>(buf), bytes, peer, tag, deadline_s);
}

FabricOp* FabricEndpoint::post_recv(void* buf, size_t bytes, int peer, uint64_t tag, double deadline_s) {
  return post(false, buf, bytes, peer, tag, deadline_s);
}

void FabricEndpoint::finish(Slot* s) {
  if (s->mr) fi_close(&s->mr->fid);
  live_.erase(s);
  delete s;
}

int FabricEndpoint::progress() {
  fi_cq_tagged_entry e[16];
  int seen = 0;
  for (;;) {
    const ssize_t n = fi_cq_read(cq_, e, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        Slot* s = static_cast<Slot::Context*>(e[i].op_context)->self;
        s->done = true;
        s->got = e[i].len;
        if (s->released) finish(s);
      }
      seen += static_cast<int>(n);
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      const ssize_t got = fi_cq_readerr(cq_, &err, 0);
      if (got == 1 && err.op_context) {
        Slot* s = static_cast<Slot::Context*>(err.op_context)->self;
        char prov_text[256] = {0};
        const char* detail = fi_cq_strerror(cq_, err.prov_errno, err.err_data, prov_text, sizeof prov_text);
        s->done = true;
        s->got = err.len;
        s->error = std::string(fi_strerror(err.err)) +
                   (err.err == FI_ETRUNC ? " (message longer than the receive)" : "") +
                   (detail && *detail ? std::string("; provider: ") + detail : std::string(""));
        if (s->released) finish(s);
        ++seen;
        continue;
      }
      // An error that belongs to no operation of ours: the endpoint itself failed.
      SHARDLM_FAIL(
          "libfabric provider " << provider_ << ": completion queue error "
                                << (got == 1 ? std::string(fi_strerror(err.err)) : fi_text(static_cast<int>(got)))
                                << " on no operation (endpoint failure)");
    }
    if (n == -FI_EAGAIN) return seen;
    SHARDLM_FAIL("libfabric provider " << provider_ << ": fi_cq_read: " << fi_text(static_cast<int>(n)));
  }
}

void FabricEndpoint::release(FabricOp* op) {
  Slot* s = static_cast<Slot*>(op);  // every FabricOp handed out is a Slot
  if (s->done) {
    finish(s);
  } else {
    s->released = true;
  }
}

}  // namespace shardlm
