// Error checks for CUDA runtime and cuBLAS calls in host code: a failure throws shardlm::Error
// naming the call, the error and the device, so the top level can abort the whole job.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "compute/backend.h"
#include "core/error.h"
#include "kv_cache_format.h"

#define SHARDLM_CUDA_CHECK(call)                                                                   \
  do {                                                                                             \
    const cudaError_t shardlm_cuda_err_ = (call);                                                  \
    if (shardlm_cuda_err_ != cudaSuccess) {                                                        \
      int shardlm_cuda_dev_ = -1;                                                                  \
      cudaGetDevice(&shardlm_cuda_dev_);                                                           \
      SHARDLM_FAIL(#call << " failed on CUDA device " << shardlm_cuda_dev_ << ": "                 \
                         << cudaGetErrorName(shardlm_cuda_err_) << " (" << cudaGetErrorString(shardlm_cuda_err_) \
                         << ")");                                                                  \
    }                                                                                              \
  } while (0)

#define SHARDLM_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                             \
    const cublasStatus_t shardlm_cublas_st_ = (call);                                              \
    SHARDLM_CHECK(shardlm_cublas_st_ == CUBLAS_STATUS_SUCCESS,                                     \
                  #call << " failed: " << cublasGetStatusName(shardlm_cublas_st_) << " ("          \
                        << cublasGetStatusString(shardlm_cublas_st_) << ")");                      \
  } while (0)

namespace shardlm {

// The backend keeps its cuBLAS handle and streams as void* (its header includes no CUDA header).
inline cublasHandle_t cublas_of(void* p) { return static_cast<cublasHandle_t>(p); }
inline cudaStream_t stream_of(void* p) { return static_cast<cudaStream_t>(p); }

// A KV cache's format as the kernels take it (kernels/kv_cache_format.h).
inline KvFormat cache_format(const KvCacheRef& cache) {
  if (cache.dtype == DType::BF16) return KvFormat(KvElem::BF16);
  if (cache.dtype == DType::F8_E4M3) return KvFormat(KvElem::FP8, cache.k_scale, cache.v_scale);
  SHARDLM_CHECK(cache.dtype == DType::F32,
                "cuda backend: a KV cache of " << dtype_name(cache.dtype) << " (F32, BF16 and F8_E4M3 are kept)");
  return KvFormat(KvElem::F32);
}

}  // namespace shardlm
