// RMSNorm over the last dimension (the device form of cpu/rmsnorm.h): out = w * (x * r) with
// r = 1 / sqrt(mean(x^2) + eps), in fp32. All pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// x, out: [rows, dim]; w: [dim]. out may alias x. twin: null, or [rows, dim] that receives out
// rounded to bf16 (bf16_bits::from_f32 of the very value written to out), for a GEMM that reads
// bf16 activations; it saves that GEMM a cast launch.
void rmsnorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out, uint16_t* twin,
             cudaStream_t stream);
// residual += x; out = rmsnorm(residual). out may alias x or residual. twin as for rmsnorm.
void add_rmsnorm(float* residual, const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out,
                 uint16_t* twin, cudaStream_t stream);

}  // namespace shardlm::cuda
