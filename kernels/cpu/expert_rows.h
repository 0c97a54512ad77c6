// Row movement of expert-parallel dispatch and combine (src/arch/expert_dispatch.h): the host
// builds the index arrays, these kernels move the activation rows, so the rows never leave
// backend memory. The reference the CUDA kernels of kernels/cuda/expert_rows.h are tested against.
//
//   gather   dst[i] = src[rows[i]] for i < n (rows of H floats); zeros where rows[i] < 0 (the
//            unused places of a fixed-capacity block, kernels/cpu/expert_exchange.h), except
//            kKeepRow, whose row is left as it is (a block's meta, written before).
//   combine  out[t] = sum of weights[i] * y[rows[i]] over i in [token_start[t], token_start[t+1]),
//            accumulated from 0 in that order, each product rounded to fp32 before it is added (no
//            fused multiply-add: the rounding of expert_combine in expert_permute.h, so a combine
//            fed in ascending expert order matches it bit for bit). out is overwritten; a token
//            with an empty range gets zeros. combine_rows_bf16 reads y as bf16 rows (a combine's
//            results as a bf16 wire carries them, kernels/cpu/wire_bf16.h), each widened exactly,
//            so it gives combine_rows' bits on the widened rows without writing them out first.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

constexpr int32_t kKeepRow = -2;

void gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, float* dst);

void combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows, const float* weights,
                  int64_t T, float* out);
void combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                       const float* weights, int64_t T, float* out);

}  // namespace shardlm::cpu
