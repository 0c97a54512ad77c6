// Device form of kernels/cpu/fp8_act_quant.h: activations [M, K] fp32 to e4m3 codes with one fp32
// scale per row and 128 features, scales[b * scale_ld + m]. The same bits as the CPU's (a maximum
// has no rounding, the division is IEEE, the conversion is fp8_bits::from_f32).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

void launch_fp8_act_quant(const float* x, int64_t M, int64_t K, uint8_t* q, float* scales, int64_t scale_ld,
                          cudaStream_t stream);

}  // namespace shardlm::cuda
