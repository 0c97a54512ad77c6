// Dispatch rows on the wire in fp8 (--ep-wire fp8, src/arch/expert_wire.h): an expert-parallel
// exchange's rows quantised to e4m3 with a scale per 128 values before an all-to-all and read back
// after it, about a quarter of their fp32 bytes (DeepEP's fp8 dispatch format). The reference the
// CUDA kernels of kernels/cuda/wire_fp8.h are tested against.
//
// A block is block_len 32-bit words. Its first round_len words are rows of row_len floats
// (round_len a multiple of row_len); the other block_len - round_len are words sent whole (a
// fixed-capacity block's int32 meta, kernels/cpu/expert_exchange.h), 4 bytes each, at the end.
// A row goes as fp8_row_bytes(row_len) bytes:
//   ceil(row_len / 128) fp32 scales, then row_len e4m3 codes, then zero bytes to a multiple of 4
// (so that every scale and every whole word stays 4-byte aligned). Each 128-value group of the row
// (the last one partial when row_len is not a multiple of 128) is quantised as the W8A8 GEMMs'
// activations are (kernels/cpu/fp8_act_quant.h): s = fp8_bits::act_scale(max |x|), code =
// fp8_bits::from_f32(x / s); read back, a value is fp8_bits::to_f32(code) * s. A NaN gives a NaN
// code and a NaN back, with the sign the device's arithmetic gives it (x86 and a GPU differ).
#pragma once

#include <cstdint>

#include "host_device.h"

namespace shardlm::cpu {

constexpr int64_t kWireFp8Group = 128;

SHARDLM_HD inline int64_t wire_fp8_groups(int64_t row_len) { return (row_len + kWireFp8Group - 1) / kWireFp8Group; }
SHARDLM_HD inline int64_t wire_fp8_row_bytes(int64_t row_len) {
  return 4 * wire_fp8_groups(row_len) + (row_len + 3) / 4 * 4;
}
// Bytes of one packed block (the CUDA kernels share these).
SHARDLM_HD inline int64_t wire_fp8_bytes(int64_t block_len, int64_t round_len, int64_t row_len) {
  return round_len / row_len * wire_fp8_row_bytes(row_len) + 4 * (block_len - round_len);
}

// dst [blocks, wire_fp8_bytes] from src [blocks, block_len].
void pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, uint8_t* dst);
// dst [blocks, block_len] from src [blocks, wire_fp8_bytes].
void unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, float* dst);

// Rows gathered onto the wire and off it, so that an exchange's row movement and its packing are
// one pass (src/arch/expert_dispatch.cpp). A wire row is wire_fp8_row_bytes(H) bytes, as above.
//   pack_rows    dst [n, wire_fp8_row_bytes(H)]: row i is src row rows[i] ([*, H] floats)
//                quantised; where rows[i] < 0 a zero row (scales 1, codes 0).
//   unpack_rows  dst [n, H] (floats): row i is wire row rows[i] of src read back; zeros where
//                rows[i] < 0.
void pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst);
void unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst);

}  // namespace shardlm::cpu
