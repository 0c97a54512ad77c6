#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16_bits.h"
#include "cublas_v2.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace shardlm_emu {
namespace {

float load(const void* p, cudaDataType t, int64_t i) {
  if (t == CUDA_R_16BF) return shardlm::bf16_bits::to_f32(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
void store(void* p, cudaDataType t, int64_t i, float v) {
  if (t == CUDA_R_16BF) {
    static_cast<uint16_t*>(p)[i] = shardlm::bf16_bits::from_f32(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}
bool supported(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

// C = alpha op(A) op(B) + beta C, column-major, each sum in fp32 in k order. beta 0 does not
// read C (cuBLAS's rule: C may hold NaN then).
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A, cudaDataType at,
          int lda, const void* B, cudaDataType bt, int ldb, float beta, void* C, cudaDataType ct, int ldc) {
  std::vector<float> a_row(static_cast<size_t>(k));
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p)
      a_row[static_cast<size_t>(p)] = load(A, at, ta == CUBLAS_OP_N ? i + int64_t{p} * lda : p + int64_t{i} * lda);
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int p = 0; p < k; ++p)
        acc += a_row[static_cast<size_t>(p)] *
               load(B, bt, tb == CUBLAS_OP_N ? p + int64_t{j} * ldb : j + int64_t{p} * ldb);
      const int64_t c = i + int64_t{j} * ldc;
      store(C, ct, c, beta == 0.0f ? alpha * acc : alpha * acc + beta * load(C, ct, c));
    }
  }
}

bool bad_shape(int m, int n, int k, int lda, int ldb, int ldc, cublasOperation_t ta, cublasOperation_t tb) {
  if (m < 0 || n < 0 || k < 0) return true;
  if (lda < (ta == CUBLAS_OP_N ? m : k) || lda < 1) return true;
  if (ldb < (tb == CUBLAS_OP_N ? k : n) || ldb < 1) return true;
  return ldc < m || ldc < 1;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) {
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void*, size_t) {
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasGetVersion(cublasHandle_t, int* version) {
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *version = 0;  // not cuBLAS
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t st) { return cublasGetStatusName(st); }

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  return cublasGemmEx(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                            int ldb, const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!supported(at) || !supported(bt) || !supported(ct) || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (bad_shape(m, n, k, lda, ldb, ldc, ta, tb) || alpha == nullptr || beta == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  // alpha and beta are host scalars, read at the call.
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  enqueue(
      h->stream, [=] { gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc); }, "cublasGemmEx");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t* ta, const cublasOperation_t* tb,
                                          const int* m, const int* n, const int* k, const void* alpha,
                                          const void* const* A, cudaDataType at, const int* lda, const void* const* B,
                                          cudaDataType bt, const int* ldb, const void* beta, void* const* C,
                                          cudaDataType ct, const int* ldc, int group_count, const int* group_size,
                                          cublasComputeType_t compute) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!supported(at) || !supported(bt) || !supported(ct) || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // bf16 inputs take a bf16 output only: cuBLAS 13.1 on an H200 answered NOT_SUPPORTED to bf16 x
  // bf16 -> fp32 here (its documented grouped type combinations have C of A's type).
  if (at == CUDA_R_16BF && ct != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  struct Problem {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, count;
    float alpha, beta;
  };
  std::vector<Problem> problems;
  for (int g = 0; g < group_count; ++g) {
    const Problem p{ta[g],
                    tb[g],
                    m[g],
                    n[g],
                    k[g],
                    lda[g],
                    ldb[g],
                    ldc[g],
                    group_size[g],
                    static_cast<const float*>(alpha)[g],
                    static_cast<const float*>(beta)[g]};
    if (p.count < 0 || bad_shape(p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.ta, p.tb)) return CUBLAS_STATUS_INVALID_VALUE;
    problems.push_back(p);
  }
  enqueue(
      h->stream,
      [=] {
        size_t idx = 0;  // problems of group g are consecutive in the pointer arrays
        for (const Problem& p : problems)
          for (int b = 0; b < p.count; ++b, ++idx)
            gemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, A[idx], at, p.lda, B[idx], bt, p.ldb, p.beta, C[idx], ct, p.ldc);
      },
      "cublasGemmGroupedBatchedEx");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmGroupedBatched(cublasHandle_t h, const cublasOperation_t* ta, const cublasOperation_t* tb,
                                         const int* m, const int* n, const int* k, const float* alpha,
                                         const float* const* A, const int* lda, const float* const* B, const int* ldb,
                                         const float* beta, float* const* C, const int* ldc, int group_count,
                                         const int* group_size) {
  return cublasGemmGroupedBatchedEx(h, ta, tb, m, n, k, alpha, reinterpret_cast<const void* const*>(A), CUDA_R_32F, lda,
                                    reinterpret_cast<const void* const*>(B), CUDA_R_32F, ldb, beta,
                                    reinterpret_cast<void* const*>(C), CUDA_R_32F, ldc, group_count, group_size,
                                    CUBLAS_COMPUTE_32F);
}

}  // namespace shardlm_emu
