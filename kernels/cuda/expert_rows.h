// Device form of kernels/cpu/expert_rows.h (read its header for the definitions): the row
// movement of expert-parallel dispatch and combine, with index arrays built on the host and
// uploaded. Same rows, same summation order and rounding as the CPU reference, so the combined
// bits are the same.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// Where rows[i] is kKeepRow, dst's row i is left as it is (a fixed-capacity block's meta).
constexpr int32_t kKeepRow = -2;

// dst[i] = src[rows[i]] (rows of H floats) for i < n; zeros where rows[i] < 0, but for kKeepRow.
// twin (null: none): dst's bf16 twin, written with it (kept rows keep theirs).
void launch_gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, float* dst, uint16_t* twin,
                        cudaStream_t stream);

// out [T, H]: per token, from 0, + weights[i] * y[rows[i]] for i in [token_start[t],
// token_start[t + 1]) in that order (multiply and add rounded separately); empty range: zeros.
void launch_combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                         const float* weights, int64_t T, float* out, cudaStream_t stream);
// The same on bf16 rows y, each widened exactly (a combine's results as a bf16 wire carries them).
void launch_combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                              const float* weights, int64_t T, float* out, cudaStream_t stream);

}  // namespace shardlm::cuda
