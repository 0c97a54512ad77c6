// SHARDLM_HD marks a function that g++ and nvcc both compile, for host and device alike: one
// definition of a rule the CPU and the GPU must agree on (the sampler's random stream, the
// attention partitions).
#pragma once

#ifdef __CUDACC__
#define SHARDLM_HD __host__ __device__
#else
#define SHARDLM_HD
#endif
// Unroll in device code (nvcc's host pass and g++ would only warn about the pragma).
#ifdef __CUDA_ARCH__
#define SHARDLM_UNROLL _Pragma("unroll")
#else
#define SHARDLM_UNROLL
#endif
