// Compiled into every program built with shardlm_comm_nccl_emu (see src/parallel/CMakeLists.txt):
// "nccl" there is the NcclCommunicator built over the emulated NCCL and CUDA runtime (whose name
// NcclCommunicator stands for in such a program), "mpi" and "fabric" stage device buffers through
// the emulated runtime's memory as comm_registry.cpp's do through the real one on a GPU machine, and
// ranks bind to the emulated GPUs by the rule of gpu_binding.h (the program's own calls reach the
// real runtime, which has none here).
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/device_info.h"
#include "parallel/comm_nccl.h"
#include "parallel/communicator.h"
#include "parallel/gpu_binding.h"
#include "parallel/memory_space.h"

namespace shardlm {
namespace {

int bind_emulated_gpu(const NodeLocal& node) {
  const int n = cuda::device_count();
  if (n <= 0) return -1;
  const int dev = node.local_rank % n;
  const cudaError_t e = cudaSetDevice(dev);
  SHARDLM_CHECK(e == cudaSuccess, "cudaSetDevice(" << dev << ") for local rank " << node.local_rank << " of "
                                                   << node.local_size << " (" << n
                                                   << " emulated GPUs): " << cudaGetErrorString(e));
  return dev;
}

std::unique_ptr<Communicator> make_nccl(const std::vector<int>& members, const std::string& name, double timeout_s) {
  SHARDLM_CHECK(cuda::device_count() > 0,
                "communicator backend nccl for group " << name << ": no emulated GPU (SHARDLM_EMULATED_GPUS is 0)");
  return std::make_unique<NcclCommunicator>(members, name, timeout_s);
}

std::shared_ptr<MemorySpace> emulated_staging() { return cuda::device_count() > 0 ? cuda_memory_space() : nullptr; }

const bool registered = (override_communicator("nccl", &make_nccl), override_staging_memory(&emulated_staging),
                         override_gpu_binding(&bind_emulated_gpu), true);

}  // namespace
}  // namespace shardlm
