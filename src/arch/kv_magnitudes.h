// KV cache calibration (shardlm run --kv-calibrate-out): the largest key and value magnitudes each
// of a stage's layers was given, folded on the device step after step ([layer][K side, V side]).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "compute/backend.h"

namespace shardlm {

class KvMagnitudes {
 public:
  explicit KvMagnitudes(ComputeBackend& b) : b_(b) {}
  ~KvMagnitudes() { b_.free(dev_); }
  KvMagnitudes(const KvMagnitudes&) = delete;
  KvMagnitudes& operator=(const KvMagnitudes&) = delete;

  bool recording() const { return dev_ != nullptr; }
  // Starts recording, from zero, for `layers` layers (again: nothing changes).
  void start(size_t layers) {
    if (dev_) return;
    layers_ = layers;
    const std::vector<float> zeros(2 * layers, 0.0f);
    dev_ = static_cast<float*>(b_.alloc(std::max<size_t>(zeros.size(), 1) * sizeof(float)));
    b_.copy_to_device(dev_, zeros.data(), zeros.size() * sizeof(float));
  }
  // Layer i's pair on the device; null when not recording.
  float* layer(size_t i) const { return dev_ ? dev_ + 2 * i : nullptr; }
  // The model's pairs [num_layers][2], this stage's from first_layer on, 0 elsewhere; empty when
  // not recording.
  std::vector<float> read(int64_t first_layer, int64_t num_layers) const {
    if (!dev_) return {};
    std::vector<float> mine(2 * layers_);
    b_.copy_to_host(mine.data(), dev_, mine.size() * sizeof(float));
    std::vector<float> all(2 * static_cast<size_t>(num_layers), 0.0f);
    std::copy(mine.begin(), mine.end(), all.begin() + 2 * first_layer);
    return all;
  }

 private:
  ComputeBackend& b_;
  float* dev_ = nullptr;
  size_t layers_ = 0;
};

}  // namespace shardlm
