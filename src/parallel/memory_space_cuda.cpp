#include <cuda_runtime.h>

#include "core/error.h"
#include "parallel/memory_space.h"

namespace shardlm {

namespace {

void check_cuda(cudaError_t e, const char* what, size_t bytes) {
  SHARDLM_CHECK(e == cudaSuccess, "staging " << bytes << " bytes: " << what << " failed: " << cudaGetErrorString(e));
}

class CudaMemorySpace final : public MemorySpace {
 public:
  std::string name() const override { return "cuda"; }
  bool is_device(const void* p) const override {
    if (p == nullptr) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // a plain host pointer on old runtimes: not an error worth keeping
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host", bytes);
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device", bytes);
  }
  void* alloc_host_staging(size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, bytes > 0 ? bytes : 1), "cudaMallocHost", bytes);
    return p;
  }
  void free_host_staging(void* p) override {
    if (p != nullptr) cudaFreeHost(p);
  }
  void* alloc_device(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes > 0 ? bytes : 1);
    SHARDLM_CHECK(e == cudaSuccess, "cudaMalloc of " << bytes << " bytes failed: " << cudaGetErrorString(e));
    return p;
  }
  void free_device(void* p) override {
    if (p != nullptr) cudaFree(p);
  }
  std::string device_name(int device) const override {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
      cudaGetLastError();
      return "";
    }
    return prop.name;
  }
};

}  // namespace

std::shared_ptr<MemorySpace> cuda_memory_space() {
  static const std::shared_ptr<MemorySpace> space = std::make_shared<CudaMemorySpace>();
  return space;
}

}  // namespace shardlm
