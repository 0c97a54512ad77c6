#include "parallel/gpu_binding.h"

#ifdef SHARDLM_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/device_info.h"
#endif

namespace shardlm {

namespace {
int (*g_binder)(const NodeLocal&) = nullptr;
}  // namespace

void override_gpu_binding(int (*binder)(const NodeLocal&)) { g_binder = binder; }

int bind_local_gpu(const NodeLocal& node) {
  if (g_binder != nullptr) return g_binder(node);
#ifdef SHARDLM_HAVE_CUDA
  const int n = cuda::device_count();
  if (n <= 0) return -1;
  const int dev = node.local_rank % n;
  const cudaError_t e = cudaSetDevice(dev);
  SHARDLM_CHECK(e == cudaSuccess, "cudaSetDevice(" << dev << ") for local rank " << node.local_rank << " of "
                                                   << node.local_size << " (" << n << " GPUs): " << cudaGetErrorString(e));
  return dev;
#else
  (void)node;
  return -1;
#endif
}

}  // namespace shardlm
