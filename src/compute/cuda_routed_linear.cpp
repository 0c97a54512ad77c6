// CudaBackend::grouped_linear_routed: a Mixture-of-Experts projection whose per-expert row ranges
// stay on the device (kernels/cuda/rows_matmul.h's routed matmul), so a decode step with MoE
// layers can be captured in a CUDA graph.
//
// The groups run through the direct kernel: a decode step spreads T * k rows over the experts
// (DeepSeek-V3 at 256 rows: 2048 rows over 256 experts, 8 on average), where reading each
// expert's weight once per 8 rows is the traffic a GEMM would have too. Where the rows average
// more than 16 a group (a large decode batch over a rank's few experts), fp8 weights under W8A8
// take the grouped W8A8 GEMM's routed launch instead (tiles of 64 rows built on the device), and
// bf16 weights the grouped bf16 GEMM's, each reading a weight once per 64 rows; fp32 weights
// reread theirs once per pass. Prefill never comes here.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/elementwise.h"
#include "cuda/rows_matmul.h"

namespace shardlm {

namespace {

cuda::RowsWeight format_of(DType dt) {
  switch (dt) {
    case DType::F8_E4M3:
      return cuda::RowsWeight::kFp8;
    case DType::BF16:
      return cuda::RowsWeight::kBf16;
    case DType::F32:
      return cuda::RowsWeight::kF32;
    default:
      break;
  }
  SHARDLM_FAIL("cuda backend: grouped_linear_routed on " << dtype_name(dt) << " weights");
}

}  // namespace

const void* CudaBackend::routed_table(const std::vector<const Matrix*>& w) {
  std::vector<const void*> key;  // what the table holds: every weight's data and scales
  key.reserve(2 * w.size());
  for (const Matrix* m : w) {
    key.push_back(m->data);
    key.push_back(m->fp8.scale_inv);
  }
  auto it = routed_tables_.find(key);
  if (it != routed_tables_.end()) return it->second;
  SHARDLM_CHECK(!capturing_, "cuda backend: the weight table of a routed grouped linear ("
                                 << w.size()
                                 << " groups) is made while capturing a CUDA graph (run the step once "
                                    "before capturing it)");
  std::vector<cuda::RoutedWeight> host;
  host.reserve(w.size());
  for (const Matrix* m : w) host.push_back({m->data, m->fp8.scale_inv});
  void* table = nullptr;
  const size_t bytes = host.size() * sizeof(cuda::RoutedWeight);
  SHARDLM_CUDA_CHECK(cudaMalloc(&table, bytes));
  owned_.push_back(table);  // not weight bytes: a few pointers per layer
  SHARDLM_CUDA_CHECK(cudaMemcpy(table, host.data(), bytes, cudaMemcpyHostToDevice));
  return routed_tables_.emplace(std::move(key), table).first->second;
}

void CudaBackend::grouped_linear_routed(Activations x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                                        const std::vector<const Matrix*>& w, float* y) {
  SHARDLM_CHECK(!w.empty(), "cuda backend: grouped_linear_routed without weights");
  if (max_rows <= 0) return;
  const Matrix& w0 = *w[0];
  const DType dt = w0.dtype;
  const int64_t N = w0.rows, K = w0.cols, G = static_cast<int64_t>(w.size());
  for (size_t g = 0; g < w.size(); ++g) {
    const Matrix& m = *w[g];
    SHARDLM_CHECK(m.rows == N && m.cols == K && m.dtype == dt, "cuda backend: grouped_linear_routed weight "
                                                                   << g << " is " << dtype_name(m.dtype) << " ["
                                                                   << m.rows << ", " << m.cols << "], weight 0 is "
                                                                   << dtype_name(dt) << " [" << N << ", " << K << "]");
    if (dt == DType::F8_E4M3) {
      const Fp8Blocks& a = m.fp8;
      SHARDLM_CHECK(
          a.scale_inv && a.cols == w0.fp8.cols && a.block_rows == w0.fp8.block_rows &&
              a.block_cols == w0.fp8.block_cols && a.row_off == w0.fp8.row_off && a.col_off == w0.fp8.col_off,
          "cuda backend: grouped_linear_routed fp8 weight " << g << "'s block layout differs from weight 0's");
    }
  }
  SHARDLM_CHECK(max_rows <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX,
                "cuda backend: grouped_linear_routed of " << max_rows << " rows x " << K << " by " << N);
  if (N == 0) return;
  const cuda::RowsWeight format = format_of(dt);
  const cudaStream_t s = stream_of(stream_);
  // Many rows a group: the grouped W8A8 GEMM on fp8 weights (cuda_fp8_grouped_gemm.cpp), the
  // grouped bf16 GEMM on bf16 ones (cuda_bf16_grouped_gemm.cpp).
  const int64_t expect = std::min(std::max<int64_t>(expect_rows, 0), max_rows);
  if (format == cuda::RowsWeight::kFp8 && routed_gemm_fp8(x.f32, max_rows, expect, offsets, w, y)) {
    last_routed_ = "one grouped W8A8 GEMM on fp8 tensor cores (" + std::string(last_core_name()) +
                   "), tiles of 64 rows listed on the device";
    return;
  }
  if (format == cuda::RowsWeight::kBf16 && routed_gemm_bf16(x, max_rows, expect, offsets, w, y)) {
    last_routed_ = "one grouped bf16 GEMM on bf16 tensor cores (" + std::string(last_core_name()) +
                   "), tiles of 64 rows listed on the device";
    return;
  }
  last_routed_ = "the direct kernel, 8 rows of a group a pass";

  // fp8 and bf16 weights take the activations as bf16, as their GEMMs do; fp32 weights fp32.
  const void* xin = format == cuda::RowsWeight::kF32 ? static_cast<const void*>(x.f32) : cast_bf16(x, max_rows * K);
  const void* table = routed_table(w);
  bool vectorised = true;
  for (const Matrix* m : w)
    vectorised = vectorised && cuda::routed_matmul_vectorised(fp8_weight(w0), format, m->data, xin);

  const auto passes = static_cast<size_t>(cuda::routed_matmul_max_passes(max_rows, G));
  // One entry more than the list: the pass count the device writes goes there.
  cuda::Fp8MatmulPass* list = grown_workspace(routed_passes_, routed_passes_n_, passes + 1, "routed pass list");
  auto* count = reinterpret_cast<int32_t*>(list + passes);
  cuda::launch_routed_matmul(xin, max_rows, offsets, G, static_cast<const cuda::RoutedWeight*>(table), fp8_weight(w0),
                             format, vectorised, list, count, y, s);
  check_launch("routed_matmul");
  ++routed_launches_;
}

}  // namespace shardlm
