// Expert permutation for a rank that holds the E consecutive experts [e0, e0 + E) of a larger set:
// the reference the CUDA kernels of kernels/cuda/expert_permute.h are tested against, with the
// same layout and the same rounding.
//
//   permute   topk ids [T, k] -> counts per local expert, offsets [E + 1] (offsets[E] = rows), and
//             a row map: the pairs (t, j) routed to local expert e take rows
//             [offsets[e], offsets[e + 1]) in increasing (t, j) order (a stable counting sort);
//             slot_row [T, k] = the row of pair (t, j), -1 when its expert is not local;
//             row_pair [rows] = t * k + j of each row. Ids outside [e0, e0 + E) are skipped, and
//             so are the pairs of a token t with pos[t] < 0 when pos is given (a CUDA graph
//             step's padding rows); counts (may be null) [E] += each local expert's rows (a
//             step's per-expert token counts, accumulated where they are made).
//   gather    xp[r] = x[row_pair[r] / k] for r < min(*rows, max_rows) (rows is the permute's
//             offsets + E where the count stays in backend memory).
//   combine   out[t] = sum of w[t, j] * yp[slot_row[t, j]] over t's local slots, accumulated
//             from 0 in ascending expert id (the order the host combine of
//             src/arch/expert_dispatch.cpp uses, so a single-rank result matches it bit for bit),
//             each term rounded to fp32 before it is added (no fused multiply-add). out is
//             overwritten; a token with no local slot gets zeros.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

void expert_permute(const int32_t* topk_ids, int64_t T, int64_t k, int32_t e0, int64_t E, const int32_t* pos,
                    int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts);

void expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* rows, int64_t max_rows,
                   float* xp);

void expert_combine(const float* yp, int64_t H, const int32_t* topk_ids, const float* topk_w,
                    const int32_t* slot_row, int64_t T, int64_t k, float* out);
// The same on rows yp in bf16 (a captured combine's results as a bf16 wire carries them), each
// widened exactly: expert_combine's bits on the widened rows.
void expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* topk_ids, const float* topk_w,
                         const int32_t* slot_row, int64_t T, int64_t k, float* out);

}  // namespace shardlm::cpu
