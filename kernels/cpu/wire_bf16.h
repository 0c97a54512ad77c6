// Rows on the wire in bf16 (--ep-wire bf16, src/arch/expert_wire.h): an expert-parallel
// exchange's blocks packed to about half their bytes before an all-to-all and widened after it.
// The reference the CUDA kernels of kernels/cuda/wire_bf16.h are tested against.
//
// A block is block_len 32-bit words. Its first round_len words are floats, rounded to bf16 to
// nearest even (kernels/bf16_bits.h: a NaN stays a quiet NaN); the other block_len - round_len
// are words sent whole (a fixed-capacity block's int32 meta, kernels/cpu/expert_exchange.h), each
// as two 16-bit halves, low half first. Packed, a block is wire_bf16_len(block_len, round_len)
// 16-bit values; widened, a rounded float is exactly its bf16 value and a whole word its bits.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

inline int64_t wire_bf16_len(int64_t block_len, int64_t round_len) { return 2 * block_len - round_len; }

// dst [blocks, wire_bf16_len] from src [blocks, block_len].
void pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst);
// dst [blocks, block_len] from src [blocks, wire_bf16_len].
void unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst);

// Rows gathered onto the wire and off it, so that an exchange's row movement and its packing are
// one pass (src/arch/expert_dispatch.cpp). A wire row is H bf16 values, rounded as above.
//   pack_rows    dst [n, H] (bf16): row i is src row rows[i] ([*, H] floats) rounded; zeros where
//                rows[i] < 0 (the unused places of a fixed-capacity block).
//   unpack_rows  dst [n, H] (floats): row i is wire row rows[i] of src widened; zeros where
//                rows[i] < 0.
void pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst);
void unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst);

}  // namespace shardlm::cpu
