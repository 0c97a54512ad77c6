#include "compute/cuda_ceilings.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <vector>

#include "compute/cuda_check.h"
#include "cuda/device_info.h"
#include "plan/gpu_specs.h"

namespace shardlm::cuda {

namespace {

// Device buffer freed on scope exit, also when a check throws.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { SHARDLM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    SHARDLM_CUDA_CHECK(cudaEventCreate(&start));
    SHARDLM_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  double seconds() const {
    float ms = 0;
    SHARDLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / 1e3;
  }
};

}  // namespace

double measure_device_bandwidth(size_t bytes, int runs) {
  DeviceBuffer a(bytes), b(bytes);
  SHARDLM_CUDA_CHECK(cudaMemset(a.p, 1, bytes));
  Events ev;
  double best = 0;
  for (int i = 0; i < runs + 1; ++i) {
    SHARDLM_CUDA_CHECK(cudaEventRecord(ev.start));
    SHARDLM_CUDA_CHECK(cudaMemcpy(b.p, a.p, bytes, cudaMemcpyDeviceToDevice));
    SHARDLM_CUDA_CHECK(cudaEventRecord(ev.stop));
    SHARDLM_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    if (i > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / ev.seconds());  // run 0 warms up
  }
  return best;
}

GemmFigure measure_gemm(int64_t m, int64_t n, int64_t k, bool bf16, int runs) {
  const size_t es = bf16 ? 2 : 4;
  DeviceBuffer x(static_cast<size_t>(m * k) * es), w(static_cast<size_t>(n * k) * es), y(static_cast<size_t>(m * n) * 4);
  // Small values (bytes 0x3c: about 0.01 in bf16 pairs, or a tiny fp32) keep the sums finite.
  SHARDLM_CUDA_CHECK(cudaMemset(x.p, 0x3c, static_cast<size_t>(m * k) * es));
  SHARDLM_CUDA_CHECK(cudaMemset(w.p, 0x3c, static_cast<size_t>(n * k) * es));
  cublasHandle_t h = nullptr;
  SHARDLM_CUBLAS_CHECK(cublasCreate(&h));
  struct HandleGuard {
    cublasHandle_t h;
    ~HandleGuard() { cublasDestroy(h); }
  } guard{h};
  SHARDLM_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  const float alpha = 1.0f, beta = 0.0f;
  const auto cuda_t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  auto run = [&] {
    SHARDLM_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                      static_cast<int>(k), &alpha, w.p, cuda_t, static_cast<int>(k), x.p, cuda_t,
                                      static_cast<int>(k), &beta, y.p, CUDA_R_32F, static_cast<int>(n),
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 3; ++i) run();
  Events ev;
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    SHARDLM_CUDA_CHECK(cudaEventRecord(ev.start));
    run();
    SHARDLM_CUDA_CHECK(cudaEventRecord(ev.stop));
    SHARDLM_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    times.push_back(ev.seconds());
  }
  std::sort(times.begin(), times.end());
  GemmFigure f;
  f.m = m;
  f.n = n;
  f.k = k;
  f.dtype = bf16 ? "bf16" : "fp32";
  f.seconds = times[times.size() / 2];
  f.tflops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / f.seconds / 1e12;
  return f;
}

std::string device_spec_name() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return "";
  std::string name = device_name(dev);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const plan::GpuSpec& s : plan::gpu_specs())
    if (name.find(s.name) != std::string::npos) return s.name;
  return "";
}

}  // namespace shardlm::cuda
