// What a device backend measures of its device for the benchmarks (ComputeBackend::
// measure_device_ceilings, time_linear_gemm): the datasheet's HBM bandwidth and dense bf16 and
// fp32 peaks (src/plan/gpu_specs.h) when the device is a known one, else the measured
// device-to-device copy bandwidth and no peak; with the measured bandwidth beside them.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

struct DeviceCeilings {
  double bw_gbs = 0;       // the bandwidth ceiling, GB/s
  double peak_gflops = 0;  // dense bf16 peak, GFLOP/s; 0 when the device is not in the table
  double fp8_gflops = 0;   // dense fp8 tensor-core peak, GFLOP/s; 0 when not in the table
  double fp32_gflops = 0;  // fp32 CUDA-core peak, GFLOP/s; 0 when the device is not in the table
  double measured_bw_gbs = 0;
  std::string text;  // one line saying all of it
};

// One GEMM of ComputeBackend::linear's form, y[m, n] = x[m, k] W^T, timed on the device.
struct GemmFigure {
  int64_t m = 0, n = 0, k = 0;
  std::string dtype;      // the weights': "bf16" (fp32 accumulate), "fp32" or "fp8" (e4m3, block scales;
                          // "fp8 w8a8" where the linear ran as the block-scaled fp8 GEMM)
  double seconds = 0;     // median of the timed runs
  double tflops = 0;      // 2 m n k / seconds / 1e12
  double weight_gbs = 0;  // the weight's bytes (fp8: codes and scales) / seconds / 1e9
};

}  // namespace shardlm
