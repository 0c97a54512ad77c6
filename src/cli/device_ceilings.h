// The current CUDA device's ceilings for the benchmarks: the datasheet's HBM bandwidth and dense
// bf16 and fp32 peaks (src/plan/gpu_specs.h) when the device is a known one, else the measured
// device-to-device copy bandwidth and no peak; with the measured bandwidth beside them.
#pragma once

#include <string>

namespace shardlm {

struct DeviceCeilings {
  double bw_gbs = 0;        // the bandwidth ceiling, GB/s
  double peak_gflops = 0;   // dense bf16 peak, GFLOP/s; 0 when the device is not in the table
  double fp32_gflops = 0;   // fp32 CUDA-core peak, GFLOP/s; 0 when the device is not in the table
  double measured_bw_gbs = 0;
  std::string text;         // one line saying all of it
};

// Throws when this build has no CUDA or there is no device.
DeviceCeilings measure_device_ceilings();

}  // namespace shardlm
