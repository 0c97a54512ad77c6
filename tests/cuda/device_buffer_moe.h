// A device array owned for the length of a test (routing, permutation, fp8 and sampling kernel
// tests): allocation and copies fail the test on a CUDA error instead of going on with garbage.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace shardlm::testmoe {

template <typename T>
class DevArray {
 public:
  explicit DevArray(size_t n) : n_(n) {
    if (n_ > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, n_ * sizeof(T)), cudaSuccess);
    }
  }
  explicit DevArray(const std::vector<T>& host) : DevArray(host.size()) { upload(host); }
  ~DevArray() {
    if (ptr_) cudaFree(ptr_);
  }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    if (n_ > 0) {
      ASSERT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// After a launch: the launch itself and the kernel's execution succeeded.
inline void expect_kernel_ok() {
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace shardlm::testmoe
