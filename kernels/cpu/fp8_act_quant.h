// Activations quantised to fp8 e4m3 in blocks of 128 along each row, the input side of a block-
// scaled fp8 GEMM (W8A8: DeepSeek-V3's inference recipe, also vLLM's and SGLang's for block-
// quantised checkpoints). Row m's block b (features [128 b, 128 b + 128), the last one partial when
// K is not a multiple of 128) takes
//   s = fp8_bits::act_scale(max |x|)   (largest magnitude -> 448),
//   q[m][k] = fp8_bits::from_f32(x[m][k] / s)   (nearest even, saturating),
// so q * s gives x back to e4m3's 3-bit mantissa. The scales are stored token-contiguous,
// scales[b * scale_ld + m], the layout cuBLASLt's 128-element 1D block scaling (VEC128_32F) reads
// for the GEMM's second operand. kernels/cuda/fp8_act_quant.h computes the same bits.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

constexpr int64_t kFp8ActBlock = 128;

// x [M, K] fp32 -> q [M, K] e4m3 codes, scales [ceil(K / 128), scale_ld] (scale_ld >= M).
void fp8_act_quant(const float* x, int64_t M, int64_t K, uint8_t* q, float* scales, int64_t scale_ld);

}  // namespace shardlm::cpu
