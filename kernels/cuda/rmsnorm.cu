// One thread block per row; the sum of squares goes through block_sum (a fixed order for a given
// blockDim, so a row's result does not depend on the other rows). Every thread writes only the
// elements it read itself, which is what makes out == x (and out == residual) safe.
#include "cuda/rmsnorm.h"

#include "bf16_bits.h"
#include "cuda/rmsnorm_row.cuh"

namespace shardlm::cuda {
namespace {

// twin is null or not for the whole launch, so the branch is uniform.
__device__ inline void put(float* out, uint16_t* twin, int64_t i, float v) {
  out[i] = v;
  if (twin) twin[i] = bf16_bits::from_f32(v);
}

__global__ void rmsnorm_kernel(const float* x, const float* w, int64_t dim, float eps, float* out, uint16_t* twin) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  block_rmsnorm_row(x + base, w, dim, eps, [&](int64_t i, float v) { put(out, twin, base + i, v); });
}

__global__ void add_rmsnorm_kernel(float* residual, const float* x, const float* w, int64_t dim, float eps, float* out,
                                   uint16_t* twin) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float* res = residual + base;
  block_rmsnorm(
      [&](int64_t i) {
        const float v = res[i] + x[base + i];
        res[i] = v;
        return v;
      },
      [&](int64_t i) { return res[i]; }, w, dim, eps, [&](int64_t i, float v) { put(out, twin, base + i, v); });
}

}  // namespace

void rmsnorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out, uint16_t* twin,
             cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), kRmsnormThreads, 0, stream>>>(x, w, dim, eps, out, twin);
}

void add_rmsnorm(float* residual, const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out,
                 uint16_t* twin, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  add_rmsnorm_kernel<<<static_cast<unsigned>(rows), kRmsnormThreads, 0, stream>>>(residual, x, w, dim, eps, out, twin);
}

}  // namespace shardlm::cuda
