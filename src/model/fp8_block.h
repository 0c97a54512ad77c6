// FP8 e4m3 ("e4m3fn": no infinities, one NaN pattern per sign) with 2-D block scales, the way
// DeepSeek-V3 and Kimi K2 ship their weights: W [R, C] in F8_E4M3 and W_scale_inv
// [ceil(R / br), ceil(C / bc)] such that the real weight is fp8_value * scale_inv of its block.
#pragma once

#include <cstdint>
#include <vector>

#include "model/checkpoint.h"

namespace shardlm {

// Exact conversions. f32_to_fp8_e4m3 rounds to nearest even and saturates to +-448 (NaN stays NaN).
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);

// Dequantises rows [r0, r0 + nr) x columns [c0, c0 + nc) of the fp8 weight W with its block scales
// (F32 or BF16) into out_bf16 [nr, nc], row-major: bf16(fp32(w) * fp32(scale)), the rounding of
// the reference dequantisation. Reads only the bytes of the slice. Throws Error naming the tensors
// when the shapes of W and its scales do not agree.
void dequant_fp8_block(const TensorView& w, const TensorView& scale_inv, int64_t block_rows, int64_t block_cols,
                       int64_t r0, int64_t nr, int64_t c0, int64_t nc, uint16_t* out_bf16);

// The checks dequant_fp8_block makes (dtypes, the scales' shape for the block size, the slice
// inside the weight); throws Error naming both tensors.
void check_fp8_slice(const TensorView& w, const TensorView& scale_inv, int64_t block_rows, int64_t block_cols,
                     int64_t r0, int64_t nr, int64_t c0, int64_t nc);

// The fp32 scales of the blocks a slice touches: rows x cols of them, from block
// (r0 / block_rows, c0 / block_cols). For a device dequantisation of the slice.
struct Fp8SliceScales {
  int64_t rows = 0, cols = 0;
  std::vector<float> scales;
};
Fp8SliceScales fp8_slice_scales(const TensorView& scale_inv, int64_t block_rows, int64_t block_cols, int64_t r0,
                                int64_t nr, int64_t c0, int64_t nc);

// Quantises w [R, C] per block: scale = amax / 448 (1 for an all-zero block), q = fp8(w / scale);
// scale_inv [ceil(R / br), ceil(C / bc)] receives the scales.
void quantize_fp8_block(const float* w, int64_t R, int64_t C, int64_t block_rows, int64_t block_cols, uint8_t* q,
                        float* scale_inv);

}  // namespace shardlm
