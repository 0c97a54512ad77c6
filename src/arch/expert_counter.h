// The step's expert loads, for MoE layers (with ep: in a captured step): counted where the routing
// is, into a device buffer of the decoder's own (not a scratch slot: it never moves, so no graph
// holds a stale pointer to it), zeroed before the step's layers run and read once after them, not
// once per layer.
#pragma once

#include <cstdint>
#include <vector>

#include "compute/backend.h"

namespace shardlm {

class ExpertCounter {
 public:
  // num_experts: 0 for a dense model, which counts nothing.
  ExpertCounter(ComputeBackend& b, int64_t num_experts) : b_(b), n_(static_cast<size_t>(num_experts)) {}
  ~ExpertCounter() { b_.free(dev_); }
  ExpertCounter(const ExpertCounter&) = delete;
  ExpertCounter& operator=(const ExpertCounter&) = delete;

  // The device counts [num_experts] (allocated at first use); null for a dense model.
  int64_t* device() {
    if (n_ == 0) return nullptr;
    if (!dev_) dev_ = static_cast<int64_t*>(b_.alloc(n_ * sizeof(int64_t)));
    return dev_;
  }
  void zero() {
    if (!device()) return;
    host_.assign(n_, 0);
    b_.copy_to_device(dev_, host_.data(), n_ * sizeof(int64_t));
  }
  // Adds the device counts to totals ([num_experts]).
  void add_to(std::vector<int64_t>* totals) {
    if (!device()) return;
    host_.resize(n_);
    b_.copy_to_host(host_.data(), dev_, n_ * sizeof(int64_t));
    for (size_t e = 0; e < n_; ++e) (*totals)[e] += host_[e];
  }

 private:
  ComputeBackend& b_;
  size_t n_;
  int64_t* dev_ = nullptr;
  std::vector<int64_t> host_;
};

}  // namespace shardlm
