// Global -> shared copies that bypass the registers (cp.async, sm_80 and later), for the GEMM
// kernels' multi-stage pipelines: a step's operands are copied while earlier steps' products run.
// Over the emulated runtime a copy lands only when a wait lets it (cuda_runtime.h's
// async_wait_group), so a kernel that waits for too few groups reads a stage's old contents there
// as it could on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace shardlm::cuda::detail {

// 16 bytes from src to dst (shared memory, 16-byte aligned), or 16 zero bytes when `full` is
// false (src-size 0: nothing is read; src must still be a valid address).
__device__ inline void copy16_async(void* dst, const void* src, bool full) {
#if defined(SHARDLM_CUDA_EMULATION)
  ::shardlm_emu::async_copy(dst, full ? src : nullptr, 16);
#elif defined(__CUDA_ARCH__)
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(full ? 16 : 0));
#else
  if (full)
    std::memcpy(dst, src, 16);
  else
    std::memset(dst, 0, 16);
#endif
}

// Closes the group of copies issued since the last commit.
__device__ inline void commit_async() {
#if defined(SHARDLM_CUDA_EMULATION)
  ::shardlm_emu::async_commit();
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most Pending of this thread's committed groups, the newest, are still in flight
// (a barrier then makes the landed ones the block's).
template <int Pending = 0>
__device__ inline void wait_async() {
#if defined(SHARDLM_CUDA_EMULATION)
  ::shardlm_emu::async_wait_group(Pending);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

}  // namespace shardlm::cuda::detail
