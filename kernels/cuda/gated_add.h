// Device form of kernels/cpu/gated_add.h: out [T, H] += g_t * y, g_t = 1 / (1 + expf(-gate[t]))
// or 1 when gate_logits is null. expf may differ from the host's by an ulp, so g_t may too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H, cudaStream_t stream);

}  // namespace shardlm::cuda
