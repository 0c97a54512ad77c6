// CudaBackend::linear for a weight kept fp8 (e4m3 codes and block scales, compute/backend.h).
//
// Few rows (decode): kernels/cuda/fp8_matmul reads the codes, one byte a weight, and dequantises
// them in registers; a pass of kFp8MatmulRowsPerPass rows reads the weight once, so its cost grows
// with the passes. More rows: the weight is dequantised into a bf16 workspace (1 byte read, 2
// written) and cuBLAS runs the bf16 GEMM on it (2 read) as for a bf16 weight; past a few passes
// that traffic is the cheaper one, and the GEMM runs on tensor cores. Both give each weight the
// host dequantisation's bf16 value, so the two paths differ in summation order only.
#include <cuda_runtime.h>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/elementwise.h"
#include "cuda/fp8_dequant.h"
#include "cuda/fp8_matmul.h"

namespace shardlm {

namespace {

// Rows up to which the fp8 weight is read directly: two passes, 2 bytes a weight, against the
// 5 bytes a weight of dequantising it first (no GPU measurement has set it yet: see the benchmark).
constexpr int64_t kFp8DirectRows = 2 * cuda::kFp8MatmulRowsPerPass;

cuda::Fp8Weight fp8_weight(const Matrix& w) {
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

}  // namespace

void CudaBackend::linear_fp8(const float* x, int64_t M, const Matrix& w, float* y) {
  SHARDLM_CHECK(w.fp8.scale_inv != nullptr && w.fp8.block_rows > 0 && w.fp8.block_cols > 0,
                "cuda backend: an F8_E4M3 linear weight [" << w.rows << ", " << w.cols << "] without block scales");
  const int64_t N = w.rows, K = w.cols;
  const cudaStream_t s = stream_of(stream_);
  if (M <= kFp8DirectRows) {
    uint16_t* xb = bf16_workspace(static_cast<size_t>(M * K));
    cuda::f32_to_bf16(x, xb, M * K, s);
    check_launch("f32_to_bf16");
    cuda::launch_fp8_matmul(xb, M, fp8_weight(w), y, s);
    check_launch("fp8_matmul");
    ++fp8_direct_calls_;
    return;
  }
  const size_t n = static_cast<size_t>(N * K);
  if (n > fp8_dequant_ws_n_) {
    SHARDLM_CHECK(!capturing_, "cuda backend: the fp8 dequantisation workspace must grow to "
                                   << n
                                   << " elements while capturing a CUDA graph (run the step once before "
                                      "capturing it)");
    void* ws = fp8_dequant_ws_;
    fp8_dequant_ws_ = nullptr;
    fp8_dequant_ws_n_ = 0;
    fp8_dequant_ws_ = static_cast<uint16_t*>(regrow_workspace(ws, n * sizeof(uint16_t)));
    fp8_dequant_ws_n_ = n;
  }
  cuda::launch_fp8_dequant_slice(static_cast<const uint8_t*>(w.data), w.fp8.scale_inv, w.fp8.cols, N, K, w.fp8.row_off,
                                 w.fp8.col_off, w.fp8.block_rows, w.fp8.block_cols, fp8_dequant_ws_, s);
  check_launch("fp8_dequant");
  gemm_bf16(x, M, fp8_dequant_ws_, N, K, y);
  ++fp8_dequant_calls_;
}

}  // namespace shardlm
