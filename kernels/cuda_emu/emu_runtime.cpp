// The runtime API over host memory: allocations are aligned host blocks, copies are memcpy, and
// every call completes before it returns.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "cuda_runtime.h"
#include "emu_state.h"

namespace shardlm_emu {
namespace {

struct State {
  std::mutex mu;
  cudaError_t last = cudaSuccess;
  std::string message;
  std::set<void*> allocations;
};
State& state() {
  static State s;
  return s;
}

cudaError_t take_error(bool clear) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const cudaError_t e = s.last;
  if (clear) s.last = cudaSuccess;
  return e;
}

}  // namespace

void set_error(cudaError_t e, const std::string& message) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.last == cudaSuccess) {
    s.last = e;
    s.message = message;
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  // 256-byte alignment, as cudaMalloc guarantees; the contents start as NaN bytes, not zeros, so a
  // kernel that reads memory nobody wrote shows it.
  const size_t rounded = (bytes + 255) / 256 * 256;
  *p = std::aligned_alloc(256, rounded > 0 ? rounded : 256);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, rounded);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.allocations.insert(*p);
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.allocations.erase(p) == 0) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (bytes > 0 && p == nullptr) return cudaErrorInvalidValue;
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  if (s == nullptr) return cudaErrorInvalidValue;
  *s = nullptr;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return take_error(false); }
cudaError_t cudaDeviceSynchronize() { return take_error(false); }
cudaError_t cudaGetLastError() { return take_error(true); }
cudaError_t cudaPeekAtLastError() { return take_error(false); }

const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaSuccess) return "no error";
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // The message of the error last recorded, when it is this one: it names the kernel and thread.
  thread_local std::string text;
  text = (e == s.last || s.last == cudaSuccess) && !s.message.empty() ? s.message : "error " + std::to_string(e);
  return text.c_str();
}

cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return cudaErrorInvalidValue;
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (d == nullptr) return cudaErrorInvalidValue;
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (p == nullptr || d != 0) return cudaErrorInvalidValue;
  *p = cudaDeviceProp{};
  std::strncpy(p->name, "host emulation of an sm_90 device", sizeof(p->name) - 1);
  p->totalGlobalMem = size_t{141} << 30;
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = max_dynamic_shared();
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}

// 0: no CUDA runtime or driver; the emulation is neither.
cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return cudaErrorInvalidValue;
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  if (v == nullptr) return cudaErrorInvalidValue;
  *v = 0;
  return cudaSuccess;
}

}  // namespace shardlm_emu
