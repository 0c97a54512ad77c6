// GPU tests: SHARDLM_REQUIRE_GPU() at the top of a test skips it, with the reason, on a machine
// without a CUDA device (or on a build without CUDA).
#pragma once

#include <gtest/gtest.h>

#ifdef SHARDLM_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/device_info.h"
#define SHARDLM_REQUIRE_GPU()                                                                  \
  do {                                                                                         \
    if (shardlm::cuda::device_count() == 0)                                                    \
      GTEST_SKIP() << "no CUDA device here (" << shardlm::cuda::why_none()                     \
                   << "); this test runs on a GPU machine (tests/gpu/run_gpu_checks.sh)";      \
  } while (0)
namespace shardlm::test {
// Whether the current device has Hopper's instructions (wgmma): compute capability 9.0.
inline bool gpu_is_hopper() {
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && shardlm::cuda::compute_capability(dev) == 90;
}
}  // namespace shardlm::test
#else
#define SHARDLM_REQUIRE_GPU() GTEST_SKIP() << "built without CUDA (no nvcc found at configure time)"
#endif
