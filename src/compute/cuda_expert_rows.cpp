// CudaBackend's expert-parallel row movement (arch/expert_dispatch.h, expert_exchange.h): the
// index plans of a captured exchange, the rows gathered and combined by index, and the rows packed
// for a bf16 or fp8 wire, by block or gathered straight onto it (kernels/cuda/expert_exchange.h,
// expert_rows.h, wire_bf16.h, wire_fp8.h, each against its kernels/cpu reference).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cpu/expert_rows.h"
#include "cuda/expert_exchange.h"
#include "cuda/expert_rows.h"
#include "cuda/wire_bf16.h"
#include "cuda/wire_fp8.h"

namespace shardlm {

namespace {
// The launch geometry of an exchange shape, checked against what one thread block holds.
cuda::ExchangeGeometry exchange_geometry(const cpu::ExchangeShape& s) {
  // Row numbers (p * Cc + q, s * R + i) and meta entries are int32.
  SHARDLM_CHECK(s.ep >= 1 && s.ep <= 65535 && s.L >= 1 && s.k >= 1 && s.C >= 0 && s.Cc >= 0 && s.H >= 1 &&
                    s.ep * std::max(s.block_rows(), s.Cc) <= INT32_MAX && s.meta() <= INT32_MAX,
                "cuda backend: an expert exchange of " << s.ep << " ranks x " << s.L << " experts, top-" << s.k << ", "
                                                       << s.C << " records and " << s.Cc << " rows a block");
  cuda::ExchangeGeometry g;
  g.ep = static_cast<int>(s.ep);
  g.L = static_cast<int>(s.L);
  g.k = static_cast<int>(s.k);
  g.C = static_cast<int>(s.C);
  g.Cc = static_cast<int>(s.Cc);
  g.H = static_cast<int>(s.H);
  g.R = static_cast<int>(s.block_rows());
  const size_t smem = std::max(cuda::expert_send_plan_smem(g), cuda::expert_recv_plan_smem(g));
  SHARDLM_CHECK(smem <= 48 * 1024, "cuda backend: an expert exchange of "
                                       << s.ep << " ranks x " << s.L << " experts needs " << smem
                                       << " bytes of shared memory (48 KiB at most)");
  return g;
}
}  // namespace

void CudaBackend::expert_send_plan(const cpu::ExchangeShape& s, const int32_t* ids, int64_t T, cpu::RowShare share,
                                   const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row,
                                   int64_t* counts, int32_t* overflow) {
  SHARDLM_CHECK(T >= 0 && T * s.k <= INT32_MAX && share.size >= 1 && share.rank >= 0 && share.rank < share.size &&
                    share.size <= INT32_MAX / std::max<int64_t>(T, 1),
                "cuda backend: expert_send_plan of " << T << " rows, share " << share.rank << " of " << share.size);
  cuda::launch_expert_send_plan(exchange_geometry(s), ids, T, static_cast<int>(share.rank),
                                static_cast<int>(share.size), pos, rec_token, blocks, pair_row, counts, overflow,
                                stream_of(stream_));
  check_launch("expert_send_plan");
}

void CudaBackend::expert_recv_plan(const cpu::ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                                   int32_t* back_row) {
  cuda::launch_expert_recv_plan(exchange_geometry(s), blocks, offsets, row_src, back_row, stream_of(stream_));
  check_launch("expert_recv_plan");
}

static_assert(cuda::kKeepRow == cpu::kKeepRow, "gather_rows' kept rows are marked alike on both backends");

void CudaBackend::gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) {
  cuda::launch_gather_rows(src, H, rows, n, dst.f32, dst.bf16, stream_of(stream_));
  check_launch("gather_rows");
}

void CudaBackend::pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) {
  cuda::launch_pack_bf16(src, blocks, block_len, round_len, dst, stream_of(stream_));
  check_launch("pack_bf16");
}

void CudaBackend::unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst) {
  cuda::launch_unpack_bf16(src, blocks, block_len, round_len, dst, stream_of(stream_));
  check_launch("unpack_bf16");
}

void CudaBackend::pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                           uint8_t* dst) {
  cuda::launch_pack_fp8(src, blocks, block_len, round_len, row_len, dst, stream_of(stream_));
  check_launch("pack_fp8");
}

void CudaBackend::unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                             float* dst) {
  cuda::launch_unpack_fp8(src, blocks, block_len, round_len, row_len, dst, stream_of(stream_));
  check_launch("unpack_fp8");
}

void CudaBackend::combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                               const float* weights, int64_t T, float* out) {
  cuda::launch_combine_rows(y, H, token_start, rows, weights, T, out, stream_of(stream_));
  check_launch("combine_rows");
}

void CudaBackend::pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst) {
  cuda::launch_pack_rows_bf16(src, H, rows, n, dst, stream_of(stream_));
  check_launch("pack_rows_bf16");
}

void CudaBackend::unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) {
  cuda::launch_unpack_rows_bf16(src, H, rows, n, dst.f32, dst.bf16, stream_of(stream_));
  check_launch("unpack_rows_bf16");
}

void CudaBackend::pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst) {
  cuda::launch_pack_rows_fp8(src, H, rows, n, dst, stream_of(stream_));
  check_launch("pack_rows_fp8");
}

void CudaBackend::unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) {
  cuda::launch_unpack_rows_fp8(src, H, rows, n, dst.f32, dst.bf16, stream_of(stream_));
  check_launch("unpack_rows_fp8");
}

void CudaBackend::combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                                    const float* weights, int64_t T, float* out) {
  cuda::launch_combine_rows_bf16(y, H, token_start, rows, weights, T, out, stream_of(stream_));
  check_launch("combine_rows_bf16");
}

}  // namespace shardlm
