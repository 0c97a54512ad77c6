// Test helpers for the CUDA kernel tests: an owning device buffer filled from and read back to
// host vectors, and a status check that turns CUDA errors into test failures (GoogleTest reports a
// thrown exception as a failed test, with its message).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// After a launcher: the launch error, then the execution error.
inline void cuda_sync(const char* what) {
  cuda_ok(cudaGetLastError(), what);
  cuda_ok(cudaDeviceSynchronize(), what);
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    // Never a zero-byte request, so a buffer always has a distinct valid address.
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p_), (n > 0 ? n : 1) * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }

  T* get() { return p_; }
  const T* get() const { return p_; }
  size_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::runtime_error("DeviceBuffer::upload: size mismatch");
    cuda_ok(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cuda_ok(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace shardlm::test
