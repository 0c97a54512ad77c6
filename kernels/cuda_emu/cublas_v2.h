// The cuBLAS calls the CUDA backend makes, for the host emulation (see cuda_runtime.h): GEMMs in
// fp32 arithmetic on host memory, issued to the handle's stream like any other work (so a graph
// capture records them). Column-major, as cuBLAS is.
#pragma once

#include <cuda_runtime.h>

// The API level emulated: the grouped GEMMs of cuBLAS 12.5.
#define CUBLAS_VERSION 120500

struct cublasContext;
using cublasHandle_t = cublasContext*;

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28 };
using cudaDataType = cudaDataType_t;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

namespace shardlm_emu {
cublasStatus_t cublasCreate(cublasHandle_t* h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* ws, size_t bytes);
cublasStatus_t cublasGetVersion(cublasHandle_t h, int* version);
const char* cublasGetStatusName(cublasStatus_t st);
const char* cublasGetStatusString(cublasStatus_t st);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
// A, B and C are device arrays of pointers (read when the work runs); the rest are host arrays
// (read at the call), as cuBLAS documents.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t* ta, const cublasOperation_t* tb,
                                          const int* m, const int* n, const int* k, const void* alpha,
                                          const void* const* A, cudaDataType Atype, const int* lda,
                                          const void* const* B, cudaDataType Btype, const int* ldb, const void* beta,
                                          void* const* C, cudaDataType Ctype, const int* ldc, int group_count,
                                          const int* group_size, cublasComputeType_t compute);
cublasStatus_t cublasSgemmGroupedBatched(cublasHandle_t h, const cublasOperation_t* ta, const cublasOperation_t* tb,
                                         const int* m, const int* n, const int* k, const float* alpha,
                                         const float* const* A, const int* lda, const float* const* B, const int* ldb,
                                         const float* beta, float* const* C, const int* ldc, int group_count,
                                         const int* group_size);
}  // namespace shardlm_emu

using shardlm_emu::cublasCreate;
using shardlm_emu::cublasDestroy;
using shardlm_emu::cublasGemmEx;
using shardlm_emu::cublasGemmGroupedBatchedEx;
using shardlm_emu::cublasGetStatusName;
using shardlm_emu::cublasGetStatusString;
using shardlm_emu::cublasGetVersion;
using shardlm_emu::cublasSetMathMode;
using shardlm_emu::cublasSetStream;
using shardlm_emu::cublasSetWorkspace;
using shardlm_emu::cublasSgemm;
using shardlm_emu::cublasSgemmGroupedBatched;
