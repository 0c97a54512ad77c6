#include "cuda/fp8_act_quant.h"
#include "cuda/fp8_group_quant.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kBlock = 128;  // features per scale
constexpr int kWarpsPerBlock = 8;

// One warp per (row, 128-feature block) (kernels/cuda/fp8_group_quant.cuh).
__global__ void fp8_act_quant_kernel(const float* x, int64_t M, int64_t K, int64_t L, uint8_t* q, float* scales,
                                     int64_t scale_ld) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (w >= M * L) return;  // the warp index is the same for the whole warp: whole warps leave
  const int64_t m = w / L, b = w % L, k0 = b * kBlock;
  const int64_t n = K - k0 < kBlock ? K - k0 : kBlock;
  const float s = quantise_group_e4m3(x + m * K + k0, n, q + m * K + k0, lane);
  if (lane == 0) scales[b * scale_ld + m] = s;
}

}  // namespace

void launch_fp8_act_quant(const float* x, int64_t M, int64_t K, uint8_t* q, float* scales, int64_t scale_ld,
                          cudaStream_t stream) {
  if (M <= 0 || K <= 0) return;
  const int64_t L = (K + kBlock - 1) / kBlock, warps = M * L;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  fp8_act_quant_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(x, M, K, L, q, scales,
                                                                                          scale_ld);
}

}  // namespace shardlm::cuda
