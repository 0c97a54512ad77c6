// Device form of kernels/cpu/wire_bf16.h (read its header for the layout): an expert-parallel
// exchange's blocks packed to bf16 for the wire and widened after it, the same bits as the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

void launch_pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst,
                      cudaStream_t stream);
void launch_unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst,
                        cudaStream_t stream);

// Rows gathered onto the wire and off it (cpu::pack_rows_bf16 / unpack_rows_bf16); the unpack
// writes dst's bf16 twin too where twin is not null.
void launch_pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst,
                           cudaStream_t stream);
void launch_unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst, uint16_t* twin,
                             cudaStream_t stream);

}  // namespace shardlm::cuda
