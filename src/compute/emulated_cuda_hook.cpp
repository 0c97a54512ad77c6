// Compiled into every program built over the emulated CUDA runtime (see src/compute/CMakeLists.txt):
// "cuda" there is the CudaBackend of shardlm_cuda_backend_emu, whose make_cuda_backend this name
// refers to in such a program.
#include "compute/backend.h"
#include "compute/cuda_backend.h"

namespace {
const bool registered = (shardlm::override_backend("cuda", &shardlm::make_cuda_backend), true);
}  // namespace
