// CudaBackend's timeline for the op profile (compute/op_profile.h): events recorded on the stream
// the ops go to, so that a section's time is the device's; and NVTX ranges around the sections,
// which nsys shows beside the kernels.
#include <cuda_runtime.h>

#include <algorithm>

#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"

#if !defined(SHARDLM_CUDA_EMULATION) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define SHARDLM_NVTX 1
#endif

namespace shardlm {

int64_t CudaBackend::mark_timeline() {
  SHARDLM_CHECK(!capturing_, "cuda backend: a timeline mark while capturing a CUDA graph");
  // Events are kept across steps: a step of a large model takes thousands of marks.
  if (timeline_used_ == timeline_events_.size()) {
    cudaEvent_t e = nullptr;
    SHARDLM_CUDA_CHECK(cudaEventCreate(&e));
    timeline_events_.push_back(e);
  }
  SHARDLM_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(timeline_events_[timeline_used_]), static_cast<cudaStream_t>(stream_)));
  return static_cast<int64_t>(timeline_used_++);
}

double CudaBackend::timeline_seconds(int64_t a, int64_t b) const {
  SHARDLM_CHECK(a >= 0 && b >= 0 && static_cast<size_t>(std::max(a, b)) < timeline_used_,
                "timeline marks " << a << " and " << b << " of " << timeline_used_);
  float ms = 0;
  SHARDLM_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(timeline_events_[a]),
                                          static_cast<cudaEvent_t>(timeline_events_[b])));
  return ms * 1e-3;
}

void CudaBackend::clear_timeline() { timeline_used_ = 0; }

void CudaBackend::push_range(const char* name) {
#ifdef SHARDLM_NVTX
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

void CudaBackend::pop_range() {
#ifdef SHARDLM_NVTX
  nvtxRangePop();
#endif
}

}  // namespace shardlm
