// CudaBackend::linear for a weight kept fp8 (e4m3 codes and block scales, compute/backend.h).
//
// Few rows (decode): kernels/cuda/rows_matmul reads the codes, one byte a weight, and dequantises
// them in registers; a pass of kFp8MatmulRowsPerPass rows reads the weight once, so its cost grows
// with the passes. More rows (prefill): by default W8A8 (cuda_w8a8_linear.cpp), the activations
// quantised to e4m3 and cuBLASLt's block-scaled fp8 GEMM on fp8 tensor cores (twice bf16's peak, the
// weight read as it is); where that does not apply (--fp8-prefill bf16, a slice off the 128x128
// grid, a shape cuBLASLt declines) the weight is dequantised into a bf16 workspace (1 byte read, 2
// written) and cuBLAS runs the bf16 GEMM on it (2 read) as for a bf16 weight. The direct and the
// dequantised paths give each weight the host dequantisation's bf16 value, so they differ in
// summation order only; W8A8 also rounds the activations to e4m3 (3 mantissa bits per 128-feature
// block scale).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/elementwise.h"
#include "cuda/fp8_dequant.h"
#include "cuda/rows_matmul.h"

namespace shardlm {

cuda::Fp8Weight CudaBackend::fp8_weight(const Matrix& w) {
  cuda::Fp8Weight f;
  f.codes = static_cast<const uint8_t*>(w.data);
  f.scale_inv = w.fp8.scale_inv;
  f.N = w.rows;
  f.K = w.cols;
  f.scale_cols = w.fp8.cols;
  f.block_rows = w.fp8.block_rows;
  f.block_cols = w.fp8.block_cols;
  f.row_off = w.fp8.row_off;
  f.col_off = w.fp8.col_off;
  return f;
}

void CudaBackend::linear_fp8(Activations x, int64_t M, const Matrix& w, float* y) {
  SHARDLM_CHECK(w.fp8.scale_inv != nullptr && w.fp8.block_rows > 0 && w.fp8.block_cols > 0,
                "cuda backend: an F8_E4M3 linear weight [" << w.rows << ", " << w.cols << "] without block scales");
  const int64_t N = w.rows, K = w.cols;
  const cudaStream_t s = stream_of(stream_);
  if (M <= kFp8DirectRows) {
    linear_fp8_direct(x, M, w, y);
    ++fp8_direct_calls_;
    return;
  }
  if (linear_w8a8(x.f32, M, w, y)) return;
  const size_t n = static_cast<size_t>(N * K);
  grown_workspace(fp8_dequant_ws_, fp8_dequant_ws_n_, n, "fp8 dequantisation");
  cuda::launch_fp8_dequant_slice(static_cast<const uint8_t*>(w.data), w.fp8.scale_inv, w.fp8.cols, N, K, w.fp8.row_off,
                                 w.fp8.col_off, w.fp8.block_rows, w.fp8.block_cols, fp8_dequant_ws_, s);
  check_launch("fp8_dequant");
  gemm_bf16(x, M, fp8_dequant_ws_, N, K, y);
  ++fp8_dequant_calls_;
}

void CudaBackend::linear_fp8_direct(Activations x, int64_t M, const Matrix& w, float* y) {
  fp8_matmul_cast(cast_bf16(x, M * w.cols), M, w, y);
}

void CudaBackend::fp8_matmul_cast(const uint16_t* xb, int64_t M, const Matrix& w, float* y) {
  cuda::launch_fp8_matmul(xb, M, fp8_weight(w), y, stream_of(stream_));
  check_launch("fp8_matmul");
}

bool CudaBackend::grouped_linear_fp8(Activations x, const std::vector<int64_t>& offsets,
                                     const std::vector<const Matrix*>& w, const std::vector<size_t>& live, float* y) {
  const Matrix& w0 = *w[live[0]];
  for (size_t g : live) {
    const Fp8Blocks& a = w[g]->fp8;
    if (w[g]->dtype != DType::F8_E4M3 || a.scale_inv == nullptr || a.cols != w0.fp8.cols ||
        a.block_rows != w0.fp8.block_rows || a.block_cols != w0.fp8.block_cols || a.row_off != w0.fp8.row_off ||
        a.col_off != w0.fp8.col_off)
      return false;
  }
  const int64_t N = w0.rows, K = w0.cols;
  const cudaStream_t s = stream_of(stream_);
  std::vector<size_t> small, big;
  for (size_t g : live) (offsets[g + 1] - offsets[g] <= kFp8DirectRows ? small : big).push_back(g);
  // The larger groups: all in one grouped W8A8 launch on fp8 tensor cores where it runs them, else
  // one GEMM each.
  last_fp8_big_grouped_ = !big.empty() && grouped_gemm_fp8(x.f32, offsets, w, big, y);
  if (last_fp8_big_grouped_) big.clear();
  for (size_t g : big) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    // W8A8 over the rows rounded up to a multiple of 4 where the buffers go on that far, so that no
    // remainder needs the direct kernel's two launches: the extra rows are later groups' (live is
    // ascending), read here and written again by their own group, a later GEMM or the grouped launch
    // below.
    const int64_t padded = (rows + 3) / 4 * 4;
    if (offsets[g] + padded <= offsets.back() && w8a8_ready() &&
        w8a8_gemm(x.f32 + offsets[g] * K, padded, *w[g], y + offsets[g] * N)) {
      ++fp8_w8a8_calls_;
      continue;
    }
    linear_fp8(x.from(offsets[g] * K), rows, *w[g], y + offsets[g] * N);
  }
  if (small.empty()) return true;
  // The small groups' rows, cast once from the first to the last of them (or their twin read).
  const int64_t base = offsets[small.front()], R = offsets[small.back() + 1] - base;
  const uint16_t* xb = cast_bf16(x.from(base * K), R * K);
  std::vector<cuda::Fp8MatmulPass> passes;
  int max_rows = 1;
  bool aligned = true;
  for (size_t g : small) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    aligned = aligned && reinterpret_cast<uintptr_t>(w[g]->data) % 16 == 0;
    for (int64_t m0 = 0; m0 < rows; m0 += cuda::kFp8MatmulRowsPerPass) {
      const auto n = static_cast<int32_t>(std::min(cuda::kFp8MatmulRowsPerPass, rows - m0));
      passes.push_back({static_cast<const uint8_t*>(w[g]->data), w[g]->fp8.scale_inv, offsets[g] - base + m0, n});
      max_rows = std::max(max_rows, static_cast<int>(n));
    }
  }
  const auto* list = static_cast<const cuda::Fp8MatmulPass*>(
      upload_list(fp8_passes_, fp8_passes_n_, passes.data(), passes.size(), sizeof(cuda::Fp8MatmulPass)));
  const cuda::Fp8Weight shape = fp8_weight(w0);
  const bool vectorised = aligned && cuda::fp8_matmul_vectorised(shape, xb);
  cuda::launch_fp8_grouped_matmul(xb, list, static_cast<int64_t>(passes.size()), max_rows, shape, vectorised,
                                  y + base * N, s);
  check_launch("fp8_grouped_matmul");
  ++fp8_grouped_calls_;
  return true;
}

}  // namespace shardlm
