// SHARDLM_HD marks a function that g++ and nvcc both compile, for host and device alike: one
// definition of a rule the CPU and the GPU must agree on (the sampler's random stream, the
// attention partitions).
#pragma once

#ifdef __CUDACC__
#define SHARDLM_HD __host__ __device__
#else
#define SHARDLM_HD
#endif
