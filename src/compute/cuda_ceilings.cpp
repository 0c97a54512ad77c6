// CudaBackend's ceilings for the benchmarks (`shardlm bench --backend cuda`, `bench-moe`): device
// memory bandwidth, as a device-to-device copy reads each byte once and writes it once, and cuBLAS
// GEMM throughput at a given shape, beside the datasheet figures of src/plan/gpu_specs.h. Built
// with the backend, so that the emulated backend measures its emulated device the same way.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "cuda/device_info.h"
#include "plan/gpu_specs.h"

namespace shardlm {

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

// Bytes moved per second (read + write) by cudaMemcpy of `bytes` within the device; best of runs.
double copy_bandwidth(size_t bytes, int runs) {
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

// `run` (one GEMM of y[m, n] = x[m, k] W^T issued on `stream`) timed: the median of `runs` after 3
// warm-up calls (which also size any workspace); weight_bytes for the GB/s of weights.
template <typename Run>
GemmFigure time_gemm(int64_t m, int64_t n, int64_t k, const char* dtype, double weight_bytes, int runs,
                     cudaStream_t stream, Run run) {
  for (int i = 0; i < 3; ++i) run();
  Events ev;
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    SHARDLM_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    run();
    SHARDLM_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
    SHARDLM_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    times.push_back(ev.seconds());
  }
  std::sort(times.begin(), times.end());
  GemmFigure f;
  f.m = m;
  f.n = n;
  f.k = k;
  f.dtype = dtype;
  f.seconds = times[times.size() / 2];
  f.tflops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / f.seconds / 1e12;
  f.weight_gbs = weight_bytes / f.seconds / 1e9;
  return f;
}

// The spec name of src/plan/gpu_specs.h whose datasheet is the device's ("h200", "h100"), or ""
// when none is.
std::string spec_name(int dev) {
  const plan::GpuSpec* s = plan::datasheet_spec(cuda::device_name(dev));
  return s ? s->name : "";
}

}  // namespace

bool CudaBackend::measure_device_ceilings(DeviceCeilings* c) {
  // 1 GiB a side saturates HBM; a device with less than 8 GiB free copies an eighth of it a side.
  size_t free_bytes = 0, total = 0;
  SHARDLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  const size_t bytes = std::max<size_t>(std::min<size_t>(size_t{1} << 30, free_bytes / 8) & ~size_t{4095}, 4096);
  *c = DeviceCeilings{};
  c->measured_bw_gbs = copy_bandwidth(bytes, 10) / 1e9;
  const std::string name = spec_name(device_);
  char buf[512];
  if (!name.empty()) {
    const plan::GpuSpec& g = plan::gpu_spec(name);
    c->bw_gbs = g.hbm_bw / 1e9;
    c->peak_gflops = g.bf16_flops / 1e9;
    c->fp8_gflops = g.fp8_flops / 1e9;
    c->fp32_gflops = g.fp32_flops / 1e9;
    std::snprintf(buf, sizeof buf,
                  "device: %s: datasheet %.0f GB/s HBM, %.0f TFLOP/s dense bf16, %.0f dense fp8; measured "
                  "device-to-device copy %.0f GB/s (%.0f%%)",
                  g.description.c_str(), c->bw_gbs, c->peak_gflops / 1e3, c->fp8_gflops / 1e3, c->measured_bw_gbs,
                  100.0 * c->measured_bw_gbs / c->bw_gbs);
  } else {
    c->bw_gbs = c->measured_bw_gbs;
    std::snprintf(buf, sizeof buf, "device: %s, not in the spec table; measured device-to-device copy %.1f GB/s",
                  cuda::device_name(device_).c_str(), c->measured_bw_gbs);
  }
  c->text = buf;
  return true;
}

GemmFigure CudaBackend::time_linear_gemm(int64_t m, int64_t n, int64_t k, bool bf16, int runs) {
  SHARDLM_CHECK(m > 0 && n > 0 && k > 0 && runs > 0,
                "cuda backend: time_linear_gemm of " << m << " x " << n << " x " << k << ", " << runs << " runs");
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
  return time_gemm(m, n, k, bf16 ? "bf16" : "fp32", static_cast<double>(n * k) * static_cast<double>(es), runs, nullptr,
                   run);
}

GemmFigure CudaBackend::time_linear(int64_t m, int64_t n, int64_t k, DType weight, int runs) {
  SHARDLM_CHECK(m > 0 && n > 0 && k > 0 && runs > 0 && (weight == DType::BF16 || weight == DType::F8_E4M3),
                "cuda backend: time_linear of " << m << " x " << n << " x " << k << ", " << dtype_name(weight)
                                                << " weights, " << runs << " runs");
  const bool fp8 = weight == DType::F8_E4M3;
  constexpr int64_t kBlock = 128;  // DeepSeek-V3's and Kimi K2's weight_block_size
  // Scale rows padded to 4 columns, as load_fp8_matrix lays them out.
  const int64_t scale_cols = ((k + kBlock - 1) / kBlock + 3) / 4 * 4;
  const int64_t scale_n = fp8 ? ((n + kBlock - 1) / kBlock) * scale_cols : 0;
  const size_t w_bytes = static_cast<size_t>(n * k) * (fp8 ? 1 : 2);
  DeviceBuffer x(static_cast<size_t>(m * k) * 4), w(w_bytes), sc(static_cast<size_t>(scale_n) * 4),
      y(static_cast<size_t>(m * n) * 4);
  // Bytes 0x3c: about 0.011 as fp32 and as bf16 pairs, 1.5 as e4m3: finite sums.
  SHARDLM_CUDA_CHECK(cudaMemset(x.p, 0x3c, static_cast<size_t>(m * k) * 4));
  SHARDLM_CUDA_CHECK(cudaMemset(w.p, 0x3c, w_bytes));
  if (scale_n) SHARDLM_CUDA_CHECK(cudaMemset(sc.p, 0x3c, static_cast<size_t>(scale_n) * 4));
  Matrix mat;
  mat.dtype = weight;
  mat.rows = n;
  mat.cols = k;
  mat.data = w.p;
  if (fp8) {
    mat.fp8.scale_inv = static_cast<const float*>(sc.p);
    mat.fp8.cols = scale_cols;
    mat.fp8.block_rows = mat.fp8.block_cols = kBlock;
  }
  auto* xf = static_cast<const float*>(x.p);
  auto* yf = static_cast<float*>(y.p);
  const int64_t w8a8_before = fp8_w8a8_calls_;
  GemmFigure f =
      time_gemm(m, n, k, fp8 ? "fp8" : "bf16", static_cast<double>(w_bytes) + 4.0 * static_cast<double>(scale_n), runs,
                stream_of(stream_), [&] { linear(xf, m, mat, nullptr, yf); });
  if (fp8_w8a8_calls_ > w8a8_before) f.dtype = "fp8 w8a8";  // ran as the block-scaled fp8 GEMM
  return f;
}

}  // namespace shardlm
