// Where a buffer lives, and how to move bytes between it and host memory. The staged MPI
// communicator goes through this interface so that its staging logic is tested without a GPU
// (tests use a heap arena that counts as "device" memory).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace shardlm {

class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  virtual std::string name() const = 0;
  // True for memory the host must not touch directly (device or managed memory). nullptr: false.
  virtual bool is_device(const void* p) const = 0;
  // Synchronous copies; when they return, the bytes are in place.
  virtual void to_host(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void to_device(void* device_dst, const void* host_src, size_t bytes) = 0;
  // Host memory for staging (pinned where the backend has it: faster copies).
  virtual void* alloc_host_staging(size_t bytes) = 0;
  virtual void free_host_staging(void* p) = 0;
};

// CUDA memory (cudaPointerGetAttributes, cudaMemcpy, cudaMallocHost). Only in CUDA builds.
#ifdef SHARDLM_HAVE_CUDA
std::shared_ptr<MemorySpace> cuda_memory_space();
#endif

}  // namespace shardlm
