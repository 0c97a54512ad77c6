// CudaBackend::grouped_linear: every group's GEMM in one cuBLAS grouped batched call, with the
// downgrades cuBLAS may force (see cuda_backend.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/elementwise.h"

// cublasGemmGroupedBatchedEx and cublasSgemmGroupedBatched came with cuBLAS 12.5.
static_assert(CUBLAS_VERSION >= 120500, "shardlm's CUDA backend needs cuBLAS 12.5 or newer (CUDA 12.5+)");

namespace shardlm {

namespace {

// cuBLAS's answers to a grouped GEMM it does not run for these types or shapes on this GPU (the
// bf16 -> fp32 combination is not documented for the grouped call): the caller downgrades.
bool refused(cublasStatus_t st) { return st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE; }

void say_downgrade(cublasHandle_t h, int st, const char* what) {
  int version = 0;
  cublasGetVersion(h, &version);
  std::fprintf(stderr, "[shardlm] cuda backend: cuBLAS %d answers %s to %s\n", version,
               cublasGetStatusName(static_cast<cublasStatus_t>(st)), what);
}

}  // namespace

void** CudaBackend::grouped_pointers(size_t n) {
  if (n > grouped_ptrs_n_) {
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream_)));  // an earlier grouped GEMM may still read them
    SHARDLM_CUDA_CHECK(cudaFree(grouped_ptrs_));
    grouped_ptrs_ = nullptr;
    grouped_ptrs_n_ = 0;
    SHARDLM_CUDA_CHECK(cudaMalloc(&grouped_ptrs_, n * sizeof(void*)));
    grouped_ptrs_n_ = n;
  }
  return grouped_ptrs_;
}

int CudaBackend::grouped_gemm(const float* x, const uint16_t* xb, const std::vector<int64_t>& offsets,
                              const std::vector<const Matrix*>& w, const std::vector<size_t>& live, bool bf16,
                              GroupedPath path, float* y) {
  const size_t G = live.size();
  const int64_t N = w[live[0]]->rows, K = w[live[0]]->cols;
  // xb and the bf16 output hold rows [base, base + R) only.
  const int64_t base = offsets[live.front()], R = offsets[live.back() + 1] - base;
  const bool bf16_out = bf16 && path == GroupedPath::kBf16Out;
  if (bf16_out && static_cast<size_t>(R * N) > grouped_out_ws_n_) {
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream_)));  // the old buffer may still be read
    SHARDLM_CUDA_CHECK(cudaFree(grouped_out_ws_));
    grouped_out_ws_ = nullptr;
    grouped_out_ws_n_ = 0;
    SHARDLM_CUDA_CHECK(cudaMalloc(&grouped_out_ws_, static_cast<size_t>(R * N) * sizeof(uint16_t)));
    grouped_out_ws_n_ = static_cast<size_t>(R * N);
  }
  // One problem per group (group_size 1: the row counts differ). Column-major view as in linear():
  // y^T[N, n] = W (read transposed from [N, K] row-major, ld K) times x^T[K, n] (ld K).
  const std::vector<cublasOperation_t> ta(G, CUBLAS_OP_T), tb(G, CUBLAS_OP_N);
  const std::vector<int> m(G, static_cast<int>(N)), k(G, static_cast<int>(K)), ld_in(G, static_cast<int>(K)),
      ld_out(G, static_cast<int>(N)), size(G, 1);
  const std::vector<float> alpha(G, 1.0f), beta(G, 0.0f);
  std::vector<int> n(G);
  // The A, B and C pointers of problem i at i, G + i and 2G + i; the device copy is what cuBLAS reads.
  grouped_host_ptrs_.resize(3 * G);
  for (size_t i = 0; i < G; ++i) {
    const size_t g = live[i];
    const int64_t r = offsets[g] - base;
    n[i] = static_cast<int>(offsets[g + 1] - offsets[g]);
    grouped_host_ptrs_[i] = w[g]->data;
    grouped_host_ptrs_[G + i] =
        bf16 ? static_cast<const void*>(xb + r * K) : static_cast<const void*>(x + offsets[g] * K);
    grouped_host_ptrs_[2 * G + i] =
        bf16_out ? static_cast<const void*>(grouped_out_ws_ + r * N) : static_cast<const void*>(y + offsets[g] * N);
  }
  void** dev = grouped_pointers(3 * G);
  // From pageable memory: returns once the host array is read, so it may be refilled at once; the
  // device array is refilled only by later work on this same stream.
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dev, grouped_host_ptrs_.data(), 3 * G * sizeof(void*), cudaMemcpyHostToDevice,
                                     stream_of(stream_)));
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (bf16) {
    st = cublasGemmGroupedBatchedEx(cublas_of(cublas_), ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                    alpha.data(), dev, CUDA_R_16BF, ld_in.data(), dev + G, CUDA_R_16BF, ld_in.data(),
                                    beta.data(), dev + 2 * G, bf16_out ? CUDA_R_16BF : CUDA_R_32F, ld_out.data(),
                                    static_cast<int>(G), size.data(), CUBLAS_COMPUTE_32F);
  } else {
    st = cublasSgemmGroupedBatched(cublas_of(cublas_), ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
                                   reinterpret_cast<const float* const*>(dev), ld_in.data(),
                                   reinterpret_cast<const float* const*>(dev + G), ld_in.data(), beta.data(),
                                   reinterpret_cast<float* const*>(dev + 2 * G), ld_out.data(), static_cast<int>(G),
                                   size.data());
  }
  if (refused(st)) return st;
  SHARDLM_CHECK(st == CUBLAS_STATUS_SUCCESS,
                (bf16 ? "cublasGemmGroupedBatchedEx" : "cublasSgemmGroupedBatched")
                    << " of " << G << " groups (N " << N << ", K " << K << ") failed: " << cublasGetStatusName(st)
                    << " (" << cublasGetStatusString(st) << ")");
  if (bf16_out) {
    cuda::bf16_to_f32(grouped_out_ws_, y + base * N, R * N, stream_of(stream_));
    check_launch("bf16_to_f32");
  }
  return CUBLAS_STATUS_SUCCESS;
}

void CudaBackend::grouped_linear(Activations x, const std::vector<int64_t>& offsets,
                                 const std::vector<const Matrix*>& w, float* y) {
  check_grouped_linear(offsets, w, "cuda backend");
  std::vector<size_t> live;
  for (size_t g = 0; g < w.size(); ++g)
    if (offsets[g + 1] > offsets[g]) live.push_back(g);
  if (live.empty()) return;
  const int64_t N = w[0]->rows, K = w[0]->cols;
  SHARDLM_CHECK(N <= INT32_MAX && K <= INT32_MAX && offsets.back() <= INT32_MAX,
                "cuda backend: grouped linear of " << offsets.back() << " rows x " << K << " by " << N
                                                   << " exceeds cuBLAS's int sizes");
  const DType dt = w[live[0]]->dtype;
  // fp8 weights: their own grouped kernel (cuda_fp8_linear.cpp); its pass list goes up by a
  // pageable copy, which a graph cannot hold.
  if (dt == DType::F8_E4M3 && !capturing_ && live.size() > 1 && grouped_linear_fp8(x, offsets, w, live, y)) {
    last_grouped_ = GroupedPath::kFp8;
    return;
  }
  bool one_dtype = dt == DType::BF16 || dt == DType::F32;
  for (size_t g : live) one_dtype = one_dtype && w[g]->dtype == dt;
  const bool bf16 = dt == DType::BF16;
  // The path is remembered per shape and dtype: a refusal (say an alignment cuBLAS wants for one
  // K) does not turn grouping off for the other projections.
  GroupedPath& path = grouped_paths_[{N, K, bf16}];
  if (capturing_ || !one_dtype || live.size() == 1 || N == 0 || K == 0 || path == GroupedPath::kPerGroup) {
    last_grouped_ = GroupedPath::kPerGroup;
    ComputeBackend::grouped_linear(x, offsets, w, y);
    return;
  }
  const std::string shape = " (N " + std::to_string(N) + ", K " + std::to_string(K) + ")";
  if (!bf16) {
    const int st = grouped_gemm(x.f32, nullptr, offsets, w, live, false, GroupedPath::kF32Out, y);
    if (st == CUBLAS_STATUS_SUCCESS) {
      last_grouped_ = GroupedPath::kSgemm;
      return;
    }
    path = GroupedPath::kPerGroup;
    say_downgrade(cublas_of(cublas_), st,
                  ("a grouped fp32 SGEMM" + shape + "; it runs one GEMM per group from now on").c_str());
    last_grouped_ = GroupedPath::kPerGroup;
    ComputeBackend::grouped_linear(x, offsets, w, y);
    return;
  }
  // The rows are cast once for all groups, unless they have a twin.
  const int64_t base = offsets[live.front()], R = offsets.back() - base;
  const uint16_t* xb = cast_bf16(x.from(base * K), R * K);
  for (const GroupedPath p : {GroupedPath::kF32Out, GroupedPath::kBf16Out}) {
    if (path != p) continue;
    const int st = grouped_gemm(x.f32, xb, offsets, w, live, true, p, y);
    if (st == CUBLAS_STATUS_SUCCESS) {
      last_grouped_ = p;
      return;
    }
    path = p == GroupedPath::kF32Out ? GroupedPath::kBf16Out : GroupedPath::kPerGroup;
    const bool fp32_out = p == GroupedPath::kF32Out;
    const std::string what = std::string("a grouped bf16 x bf16 -> ") + (fp32_out ? "fp32" : "bf16") + " GEMM" + shape +
                             (fp32_out ? "; it writes bf16 and casts to fp32 from now on"
                                       : "; it runs one GEMM per group from now on");
    say_downgrade(cublas_of(cublas_), st, what.c_str());
  }
  last_grouped_ = GroupedPath::kPerGroup;
  ComputeBackend::grouped_linear(x, offsets, w, y);
}

std::string CudaBackend::grouped_linear_path() const {
  switch (last_grouped_) {
    case GroupedPath::kSgemm: return "cuBLAS grouped batched SGEMM, fp32";
    case GroupedPath::kF32Out: return "cuBLAS grouped batched GEMM, bf16 in, fp32 out";
    case GroupedPath::kBf16Out: return "cuBLAS grouped batched GEMM, bf16 in, bf16 out, cast to fp32";
    case GroupedPath::kFp8:
      if (last_fp8_big_grouped_)
        return "fp8 codes read by one grouped kernel for groups of up to 16 rows, larger groups in one grouped W8A8 "
               "launch on fp8 tensor cores (e4m3 on " +
               std::string(last_core_name()) + ", block scales applied per 128 features)";
      return w8a8_ ? "fp8 codes read by one grouped kernel for groups of up to 16 rows, larger groups one by one "
                     "as W8A8 block-scaled fp8 GEMMs (cuBLASLt), where it runs them, else dequantised for cuBLAS"
                   : "fp8 codes read by one grouped kernel for groups of up to 16 rows, larger groups dequantised for "
                     "cuBLAS one by one";
    case GroupedPath::kPerGroup: break;
  }
  return "one cuBLAS GEMM per group";
}

}  // namespace shardlm
