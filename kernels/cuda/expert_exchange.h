// Device form of kernels/cpu/expert_exchange.h (read its header for the definitions): the index
// plans of a fixed-capacity expert-parallel exchange, built on the device from the device routing,
// so that a captured step holds the whole dispatch and combine. The same integers as the CPU
// reference.
//
// The send plan runs a thread block per peer block, the recv plan one thread block; both walk the
// tokens or records in tiles of 256, a thread each: a block-wide scan numbers the records, and
// per-warp bit masks of the local experts rank each pair among its expert's in tile order (as
// kernels/cuda/expert_permute.cu ranks its pairs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

struct ExchangeGeometry {
  int ep = 1, L = 0, k = 1;  // ranks, experts per rank, experts per token
  int C = 0, Cc = 0;         // records per block, returned rows per block
  int H = 1, R = 0;          // floats a row, rows a dispatch block (records, then meta)
};

// Shared memory the launches need, so callers can check a geometry before capturing.
size_t expert_send_plan_smem(const ExchangeGeometry& g);
size_t expert_recv_plan_smem(const ExchangeGeometry& g);

// topk_ids [T, k] (tp rank share_rank of share_size: its share of the real rows read), pos [T] or
// null -> rec_token [ep*R], the meta rows of blocks [ep*R*H], pair_row [T*k]; counts [ep*L]
// (int64, may be null) +=; *overflow = 1 when a block overflows.
void launch_expert_send_plan(const ExchangeGeometry& g, const int32_t* topk_ids, int64_t T, int share_rank,
                             int share_size, const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row,
                             int64_t* counts, int32_t* overflow, cudaStream_t stream);

// The meta of received blocks [ep*R*H] -> offsets [L + 1], row_src [ep*Cc], back_row [ep*Cc].
void launch_expert_recv_plan(const ExchangeGeometry& g, const float* blocks, int32_t* offsets, int32_t* row_src,
                             int32_t* back_row, cudaStream_t stream);

}  // namespace shardlm::cuda
