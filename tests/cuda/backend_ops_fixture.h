// The fixture of the CudaBackend-against-CpuBackend op tests (test_cuda_backend_ops.cpp,
// test_cuda_wire_ops.cpp): a CPU backend and a CUDA one; skips without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "common/gpu.h"
#include "compute/backend.h"
#include "compute/cpu_backend.h"

namespace shardlm {

class CudaBackendOps : public ::testing::Test {
 protected:
  void SetUp() override {
    SHARDLM_REQUIRE_GPU();
    gpu_ = make_backend("cuda");
  }
  CpuBackend cpu_;
  std::unique_ptr<ComputeBackend> gpu_;
};

}  // namespace shardlm
