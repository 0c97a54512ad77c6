// The emulated runtime's error state, shared by the launcher and the API functions.
#pragma once

#include <cstddef>
#include <string>

#include "cuda_runtime.h"

namespace shardlm_emu {

// Records an error for the next cudaGetLastError / cudaDeviceSynchronize, with its message for
// cudaGetErrorString.
void set_error(cudaError_t e, const std::string& message);
size_t max_dynamic_shared();

}  // namespace shardlm_emu
