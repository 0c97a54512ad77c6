// The cuBLASLt calls the CUDA backend makes, for the host emulation (see cuda_runtime.h): the
// block-scaled fp8 GEMM of Hopper (cuBLAS 12.9+: e4m3 A and B, 128-element 1D and 128x128 2D block
// scales, fp32 D), column-major, issued to the stream like any other work. The heuristic accepts
// what the cuBLAS documentation lists for it on compute capability 9.0 (the "TN" format, compute and
// scale type 32F, M and N multiples of 4, 16-byte aligned matrices and scales, not both operands
// 2D-scaled) and answers CUBLAS_STATUS_NOT_SUPPORTED for anything else, so a caller's fallback runs
// here as it would on a GPU whose cuBLAS declines. Enumerators carry the real header's values.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cublas_v2.h"

struct cublasLtContext;
using cublasLtHandle_t = cublasLtContext*;
struct cublasLtMatmulDescEmu;
using cublasLtMatmulDesc_t = cublasLtMatmulDescEmu*;
struct cublasLtMatrixLayoutEmu;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutEmu*;
struct cublasLtMatmulPreferenceEmu;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceEmu*;

struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
  CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
  CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
  CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
};
enum cublasLtMatmulMatrixScale_t {
  CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0,
  CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4,
  CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5,
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

namespace shardlm_emu {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
size_t cublasLtGetVersion();
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);
}  // namespace shardlm_emu

using shardlm_emu::cublasLtCreate;
using shardlm_emu::cublasLtDestroy;
using shardlm_emu::cublasLtGetVersion;
using shardlm_emu::cublasLtMatmul;
using shardlm_emu::cublasLtMatmulAlgoGetHeuristic;
using shardlm_emu::cublasLtMatmulDescCreate;
using shardlm_emu::cublasLtMatmulDescDestroy;
using shardlm_emu::cublasLtMatmulDescSetAttribute;
using shardlm_emu::cublasLtMatmulPreferenceCreate;
using shardlm_emu::cublasLtMatmulPreferenceDestroy;
using shardlm_emu::cublasLtMatmulPreferenceSetAttribute;
using shardlm_emu::cublasLtMatrixLayoutCreate;
using shardlm_emu::cublasLtMatrixLayoutDestroy;
