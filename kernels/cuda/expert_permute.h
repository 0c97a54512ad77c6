// Expert permutation on the device for a rank holding the E consecutive experts [e0, e0 + E):
// group the routed (token, slot) pairs per local expert so each expert runs on contiguous rows,
// and combine the experts' rows back per token with the routing weights. Layout and rounding are
// those of the CPU reference kernels/cpu/expert_permute.h (read its header for the definitions):
// deterministic, the same rows in the same order, the same combined bits.
//
// All index arrays are int32 (rows < 2^31). Buffers sized for the worst case (rows <= T * k) let a
// step run without reading the row count back to the host: the gather reads it on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// topk_ids [T, k] -> offsets [E + 1], slot_row [T, k] (-1: not local, or a token with pos[t] < 0
// when pos [T] is given), row_pair [>= rows] (row -> t * k + j); counts [E] (may be null) += each
// local expert's rows. One thread block; shared memory 18 * E * 4 bytes. With T * k == 0 it only
// zeroes offsets.
void launch_expert_permute(const int32_t* topk_ids, int64_t T, int k, int32_t e0, int E, const int32_t* pos,
                           int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts,
                           cudaStream_t stream);

// xp[r] = x[row_pair[r] / k] (rows of H floats) for r < *num_rows (a device pointer, e.g.
// offsets + E); max_rows (e.g. T * k) bounds the grid. twin: null, or the same rows rounded to
// bf16 (bf16_bits::from_f32), for the experts' GEMMs to read without a cast.
void launch_expert_gather(const float* x, int64_t H, int k, const int32_t* row_pair, const int32_t* num_rows,
                          int64_t max_rows, float* xp, uint16_t* twin, cudaStream_t stream);

// out [T, H] = per token, from 0, + w[t, j] * yp[slot_row[t, j]] over the local slots in ascending
// expert id.
void launch_expert_combine(const float* yp, int64_t H, const int32_t* topk_ids, const float* topk_w,
                           const int32_t* slot_row, int64_t T, int k, float* out, cudaStream_t stream);
// The same on bf16 rows yp, each widened exactly (cpu::expert_combine_bf16).
void launch_expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* topk_ids, const float* topk_w,
                                const int32_t* slot_row, int64_t T, int k, float* out, cudaStream_t stream);

}  // namespace shardlm::cuda
