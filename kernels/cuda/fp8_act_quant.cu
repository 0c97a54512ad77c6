#include "cuda/fp8_act_quant.h"
#include "fp8_bits.h"

namespace shardlm::cuda {
namespace {

constexpr int kBlock = 128;  // features per scale
constexpr int kWarpsPerBlock = 8;

// One warp per (row, 128-feature block): each lane holds 4 values (lane, lane + 32, ...: every
// load instruction reads 128 contiguous bytes), the warp folds their magnitudes to the block's
// maximum, and each lane writes its 4 codes.
__global__ void fp8_act_quant_kernel(const float* x, int64_t M, int64_t K, int64_t L, uint8_t* q, float* scales,
                                     int64_t scale_ld) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (w >= M * L) return;  // the warp index is the same for the whole warp: whole warps leave
  const int64_t m = w / L, b = w % L, k0 = b * kBlock;
  const float* row = x + m * K;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t k = k0 + lane + 32 * i;
    v[i] = k < K ? row[k] : 0.0f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = fp8_bits::act_scale(amax);
  uint8_t* out = q + m * K;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t k = k0 + lane + 32 * i;
    if (k < K) out[k] = fp8_bits::from_f32(v[i] / s);
  }
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
