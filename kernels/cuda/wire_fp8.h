// Device form of kernels/cpu/wire_fp8.h (read its header for the layout): an expert-parallel
// exchange's rows quantised to fp8 with a scale per 128 values for the wire and read back after
// it, the same bits as the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

void launch_pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                     uint8_t* dst, cudaStream_t stream);
void launch_unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                       float* dst, cudaStream_t stream);

// Rows gathered onto the wire and off it (cpu::pack_rows_fp8 / unpack_rows_fp8); the unpack
// writes dst's bf16 twin too where twin is not null.
void launch_pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst,
                          cudaStream_t stream);
void launch_unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst, uint16_t* twin,
                            cudaStream_t stream);

}  // namespace shardlm::cuda
