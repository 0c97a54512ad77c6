// FP8 e4m3 block dequantisation on the device: w [rows, cols] (e4m3fn bytes) with fp32 scale_inv
// [ceil(rows / block_rows), ceil(cols / block_cols)] -> bf16 [rows, cols] (raw uint16 bits),
// row-major, bf16(fp32(w) * scale) rounded to nearest even: bit-identical to the host's
// dequant_fp8_block (src/model/fp8_block.h) on x86, NaN codes (0x7f, 0xff) and NaN / infinite
// scales included (the one exception: a NaN code with a NaN scale gives the code's NaN here, and
// on the host whichever operand its compiler put first).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

void launch_fp8_dequant(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols, int64_t block_rows,
                        int64_t block_cols, uint16_t* out_bf16, cudaStream_t stream);

// A slice of a larger quantised matrix: w [rows, cols] holds rows [row0, row0 + rows) and columns
// [col0, col0 + cols) of it, scale_inv [.., scale_cols] the scales of the blocks that slice
// touches, starting at block (row0 / block_rows, col0 / block_cols). Element (r, c) of the slice
// takes scale_inv[((r + row0 % block_rows) / block_rows) * scale_cols + (c + col0 % block_cols) /
// block_cols]. A tensor-parallel rank's slice need not start on a block boundary.
void launch_fp8_dequant_slice(const uint8_t* w, const float* scale_inv, int64_t scale_cols, int64_t rows, int64_t cols,
                              int64_t row0, int64_t col0, int64_t block_rows, int64_t block_cols, uint16_t* out_bf16,
                              cudaStream_t stream);

}  // namespace shardlm::cuda
