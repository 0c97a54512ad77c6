// Activation scratch for one step, in backend memory, grown on demand (never shrunk: steps are
// similar in size). Slots are numbered; each block of the model uses its own range of slots.
// generation() counts reallocations: a captured CUDA graph holds the slot pointers it was
// captured with, so it is valid only while the generation is the one it was captured at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compute/backend.h"

namespace shardlm {

class Scratch {
 public:
  explicit Scratch(ComputeBackend& b) : b_(b) {}
  ~Scratch() {
    for (auto& s : slots_) b_.free(s.p);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // At least n floats (or the same bytes of another type) in slot idx.
  float* get(int idx, size_t n) {
    if (slots_.size() <= static_cast<size_t>(idx)) slots_.resize(idx + 1);
    auto& s = slots_[idx];
    if (s.n < n) {
      b_.free(s.p);
      s.p = nullptr;  // a failed alloc below must not leave a freed pointer behind
      s.n = 0;
      ++generation_;
      s.p = static_cast<float*>(b_.alloc(n * sizeof(float)));
      s.n = n;
    }
    return s.p;
  }
  template <typename T>
  T* get_as(int idx, size_t n) {
    return reinterpret_cast<T*>(get(idx, (n * sizeof(T) + sizeof(float) - 1) / sizeof(float)));
  }
  ComputeBackend& backend() { return b_; }
  // Incremented whenever a slot's pointer changes (see the file comment).
  uint64_t generation() const { return generation_; }

  // Slot ranges: the decoder's own, attention blocks', feed-forward blocks'.
  static constexpr int kDecoder = 0, kAttention = 20, kFeedForward = 40;

 private:
  struct Slot {
    float* p = nullptr;
    size_t n = 0;
  };
  ComputeBackend& b_;
  std::vector<Slot> slots_;
  uint64_t generation_ = 0;
};

}  // namespace shardlm
