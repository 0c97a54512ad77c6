#include "cli/device_ceilings.h"

#include <cstdio>

#include "core/error.h"
#include "plan/gpu_specs.h"
#ifdef SHARDLM_HAVE_CUDA
#include "compute/cuda_ceilings.h"
#endif

namespace shardlm {

DeviceCeilings measure_device_ceilings() {
  DeviceCeilings c;
#ifdef SHARDLM_HAVE_CUDA
  c.measured_bw_gbs = cuda::measure_device_bandwidth() / 1e9;
  const std::string name = cuda::device_spec_name();
  char buf[512];
  if (!name.empty()) {
    const plan::GpuSpec& g = plan::gpu_spec(name);
    c.bw_gbs = g.hbm_bw / 1e9;
    c.peak_gflops = g.bf16_flops / 1e9;
    c.fp32_gflops = g.fp32_flops / 1e9;
    std::snprintf(buf, sizeof buf,
                  "device: %s: datasheet %.0f GB/s HBM, %.0f TFLOP/s dense bf16; measured device-to-device copy "
                  "%.0f GB/s (%.0f%%)",
                  g.description.c_str(), c.bw_gbs, c.peak_gflops / 1e3, c.measured_bw_gbs,
                  100.0 * c.measured_bw_gbs / c.bw_gbs);
  } else {
    c.bw_gbs = c.measured_bw_gbs;
    std::snprintf(buf, sizeof buf, "device: not in the spec table; measured device-to-device copy %.0f GB/s",
                  c.measured_bw_gbs);
  }
  c.text = buf;
#else
  SHARDLM_FAIL("this build has no CUDA");
#endif
  return c;
}

}  // namespace shardlm
