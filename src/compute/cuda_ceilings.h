// Measured ceilings of the current CUDA device, for `shardlm bench --backend cuda`: device memory
// bandwidth (a device-to-device copy: each byte read once and written once) and cuBLAS GEMM
// throughput at a given shape, beside the datasheet figures of src/plan/gpu_specs.h.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm::cuda {

struct GemmFigure {
  int64_t m = 0, n = 0, k = 0;
  std::string dtype;      // "bf16" (fp32 accumulate) or "fp32"
  double seconds = 0;     // median of the timed runs
  double tflops = 0;      // 2 m n k / seconds / 1e12
};

// Bytes moved per second (read + write) by cudaMemcpy of `bytes` within the device; best of runs.
double measure_device_bandwidth(size_t bytes = size_t{1} << 30, int runs = 10);
// y[m, n] = x[m, k] W^T with W [n, k], as CudaBackend::linear runs it; median of `runs` after warm-up.
GemmFigure measure_gemm(int64_t m, int64_t n, int64_t k, bool bf16, int runs = 20);
// The device's marketing name and the spec name of src/plan/gpu_specs.h that matches it ("h200",
// "h100"), or "" when none does.
std::string device_spec_name();

}  // namespace shardlm::cuda
