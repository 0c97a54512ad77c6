// CudaBackend::grouped_gemm_fp8: the routed experts' groups past the direct rows in one grouped
// W8A8 launch on fp8 tensor cores (kernels/cuda/fp8_grouped_gemm_mma.h), where cuBLASLt's
// block-scaled GEMM (cuda_w8a8_linear.cpp) takes one launch per expert. The arithmetic is W8A8's:
// the same e4m3 activations and block scales, fp32 promotion per 128 features; only the order of
// the sums within a block differs (the tensor cores' own).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/fp8_act_quant.h"
#include "cuda/fp8_grouped_gemm_mma.h"

namespace shardlm {

namespace {

constexpr int64_t kBlock = 128;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

const uint8_t* CudaBackend::quantised_rows(const float* x, int64_t R, int64_t K, const float** scales) {
  const int64_t L = (K + kBlock - 1) / kBlock;
  // The codes, then the scales [L][R] at the next 256-byte boundary.
  const size_t codes = (static_cast<size_t>(R * K) + 255) / 256 * 256;
  uint8_t* ws = grown_workspace(w8a8_ws_, w8a8_ws_n_, codes + static_cast<size_t>(L * R) * sizeof(float), "W8A8");
  auto* sc = reinterpret_cast<float*>(ws + codes);
  cuda::launch_fp8_act_quant(x, R, K, ws, sc, R, stream_of(stream_));
  check_launch("fp8_act_quant");
  *scales = sc;
  return ws;
}

void CudaBackend::run_grouped_gemm_fp8(const float* x, int64_t R, const cuda::Fp8Weight& shape,
                                       const std::vector<cuda::Fp8GemmTile>& tiles, float* y) {
  const cudaStream_t s = stream_of(stream_);
  const float* scales = nullptr;
  const uint8_t* ws = quantised_rows(x, R, shape.K, &scales);
  const auto* list = static_cast<const cuda::Fp8GemmTile*>(
      upload_list(fp8_gemm_tiles_, fp8_gemm_tiles_n_, tiles.data(), tiles.size(), sizeof(cuda::Fp8GemmTile)));
  cuda::launch_fp8_grouped_gemm_mma(ws, scales, R, list, static_cast<int64_t>(tiles.size()), shape, y, s,
                                    launch_core());
  check_launch("fp8_grouped_gemm_mma");
}

bool CudaBackend::grouped_gemm_fp8(const float* x, const std::vector<int64_t>& offsets,
                                   const std::vector<const Matrix*>& w, const std::vector<size_t>& big, float* y) {
  // One group gains nothing from the grouped launch: cuBLASLt's tuned GEMM runs it; nor do groups of
  // many rows, where cuBLASLt's kernels outran this one on mma.sync (kFp8GroupedGemmMaxRows).
  if (!grouped_gemm_ || big.size() < 2 || !w8a8_ready() || grouped_gemm_bad_) return false;
  int64_t big_rows = 0;
  for (size_t g : big) big_rows += offsets[g + 1] - offsets[g];
  if (big_rows > kFp8GroupedGemmMaxRows * static_cast<int64_t>(big.size())) return false;
  const cuda::Fp8Weight shape = fp8_weight(*w[big[0]]);
  if (!cuda::fp8_grouped_gemm_mma_fits(shape)) return false;
  for (size_t g : big)
    if (!aligned16(w[g]->data)) return false;
  const int64_t base = offsets[big.front()], R = offsets[big.back() + 1] - base;
  std::vector<cuda::Fp8GemmTile> tiles;
  for (size_t g : big) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    for (int64_t m0 = 0; m0 < rows; m0 += cuda::kFp8GemmTileRows)
      tiles.push_back({static_cast<const uint8_t*>(w[g]->data), w[g]->fp8.scale_inv, offsets[g] - base + m0,
                       static_cast<int32_t>(std::min<int64_t>(cuda::kFp8GemmTileRows, rows - m0)), 0});
  }
  // The rows from the first big group to the last are quantised at once, the small groups' among
  // them too (their codes are not read).
  run_grouped_gemm_fp8(x + base * shape.K, R, shape, tiles, y + base * shape.N);
  ++fp8_grouped_gemm_calls_;
  return true;
}

bool CudaBackend::routed_gemm_fp8(const float* x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                                  const std::vector<const Matrix*>& w, float* y) {
  const auto G = static_cast<int64_t>(w.size());
  // At the few rows per expert of a usual decode step the direct kernel reads each weight once
  // per 8 rows, the traffic a GEMM would have too; past kFp8DirectRows on average the grouped GEMM
  // reads it once per 64. (A capture never runs the self-check: the step's eager run before it has.)
  if (!grouped_gemm_ || expect_rows <= kFp8DirectRows * G || (capturing_ && !w8a8_checked_) || !w8a8_ready() ||
      grouped_gemm_bad_)
    return false;
  const cuda::Fp8Weight shape = fp8_weight(*w[0]);
  if (!cuda::fp8_grouped_gemm_mma_fits(shape)) return false;
  for (const Matrix* m : w)
    if (!aligned16(m->data)) return false;
  const float* scales = nullptr;
  const uint8_t* q = quantised_rows(x, max_rows, shape.K, &scales);
  int32_t* count = nullptr;
  cuda::Fp8GemmTile* list = routed_tile_list(cuda::fp8_routed_gemm_max_tiles(max_rows, G), &count);
  cuda::launch_fp8_routed_gemm_mma(q, scales, max_rows, max_rows, offsets, G,
                                   static_cast<const cuda::RoutedWeight*>(routed_table(w)), shape, list, count, y,
                                   stream_of(stream_), launch_core());
  check_launch("fp8_routed_gemm_mma");
  ++fp8_routed_gemm_calls_;
  return true;
}

}  // namespace shardlm
