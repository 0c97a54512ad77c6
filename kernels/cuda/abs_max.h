// Device form of kernels/cpu/abs_max.h: *acc = max(*acc, max_i |x[i]|), acc in device memory. The
// same value as the CPU's (a maximum has no rounding), whatever the launch shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

void launch_abs_max(const float* x, int64_t n, float* acc, cudaStream_t stream);

}  // namespace shardlm::cuda
