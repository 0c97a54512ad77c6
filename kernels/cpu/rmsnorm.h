// RMSNorm over the last dimension: out = x / sqrt(mean(x^2) + eps) * w, in fp32 (as Hugging Face
// LlamaRMSNorm computes it). out may alias x.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

void rmsnorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out);
// residual += x; out = rmsnorm(residual). The fused form of a pre-norm block's epilogue.
void add_rmsnorm(float* residual, const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                 float* out);

}  // namespace shardlm::cpu
