// Device memory for a backend self-check's operands: each host vector copied up, everything freed
// however the check ends (a throw included).
#pragma once

#include <cstddef>
#include <vector>

#include "compute/backend.h"

namespace shardlm {

struct CheckBuffers {
  ComputeBackend& b;
  std::vector<void*> p;
  template <class T>
  T* up(const std::vector<T>& host) {
    p.push_back(b.alloc(host.size() * sizeof(T)));
    b.copy_to_device(p.back(), host.data(), host.size() * sizeof(T));
    return static_cast<T*>(p.back());
  }
  ~CheckBuffers() {
    for (void* q : p) b.free(q);
  }
};

}  // namespace shardlm
