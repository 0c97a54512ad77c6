// CudaBackend::routed_gemm_bf16: a routed grouped linear (a Mixture-of-Experts step captured in a
// CUDA graph) on bf16 weights whose groups average more rows than the direct kernel takes well,
// in one grouped GEMM on bf16 tensor cores (kernels/cuda/bf16_grouped_gemm_mma.h) from tiles the
// device lists. The arithmetic is a bf16 GEMM's: the rows rounded to bf16 once, exact products,
// fp32 sums (in the tensor cores' order) and fp32 output, as the direct kernel and cuBLAS's
// fp32-output GEMM compute them up to summation order.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/bf16_grouped_gemm_mma.h"
#include "cuda/elementwise.h"

namespace shardlm {

cuda::GemmTile* CudaBackend::routed_tile_list(int64_t tiles, int32_t** count) {
  cuda::GemmTile* list =
      grown_workspace(routed_gemm_tiles_, routed_gemm_tiles_n_, static_cast<size_t>(tiles) + 1, "routed tile list");
  *count = reinterpret_cast<int32_t*>(list + tiles);
  return list;
}

bool CudaBackend::routed_gemm_bf16(Activations x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                                   const std::vector<const Matrix*>& w, float* y) {
  const auto G = static_cast<int64_t>(w.size());
  // At a usual decode step's few rows per expert the direct kernel reads each weight once per 8
  // rows, what a GEMM's traffic would be too; past 16 on average this reads it once per 64.
  if (!routed_grouped_ || expect_rows <= kFp8DirectRows * G) return false;
  const int64_t N = w[0]->rows, K = w[0]->cols;
  if (!cuda::bf16_grouped_gemm_mma_fits(N, K)) return false;
  for (const Matrix* m : w)
    if (reinterpret_cast<uintptr_t>(m->data) % 16 != 0) return false;
  const cudaStream_t s = stream_of(stream_);
  // The bf16 workspace is 256-byte aligned; a twin is a scratch slot, aligned as the backend's
  // allocations are. Rows of K % 8 == 0 keep every row 16-byte aligned.
  const uint16_t* xb = cast_bf16(x, max_rows * K);
  int32_t* count = nullptr;
  cuda::GemmTile* list = routed_tile_list(cuda::bf16_routed_gemm_max_tiles(max_rows, G), &count);
  cuda::launch_bf16_routed_gemm_mma(xb, max_rows, offsets, G, static_cast<const cuda::RoutedWeight*>(routed_table(w)),
                                    N, K, list, count, y, s, launch_core());
  check_launch("bf16_routed_gemm_mma");
  ++bf16_routed_gemm_calls_;
  return true;
}

}  // namespace shardlm
