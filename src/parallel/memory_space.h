// Where a buffer lives, and how to move bytes between it and host memory. The staged MPI
// communicator goes through this interface so that its staging logic is tested without a GPU
// (tests use a heap arena that counts as "device" memory); shardlm bench-comm allocates its device
// buffers through the space of the communicator it measures.
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
  // Device memory on the current device (at least one byte, so that size 0 is a real pointer).
  virtual void* alloc_device(size_t bytes) = 0;
  virtual void free_device(void* p) = 0;
  // What device d is ("NVIDIA H200"), "" when the space cannot say.
  virtual std::string device_name(int device) const = 0;
};

// CUDA memory (cudaPointerGetAttributes, cudaMemcpy, cudaMallocHost). Only in CUDA builds.
#ifdef SHARDLM_HAVE_CUDA
std::shared_ptr<MemorySpace> cuda_memory_space();
#endif

}  // namespace shardlm
