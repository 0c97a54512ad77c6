// One 128-value group of a row quantised to fp8 e4m3 by one warp, the device form of the
// activation quantisation of kernels/cpu/fp8_act_quant.h (the W8A8 GEMMs' inputs and the fp8
// wire's rows): each lane holds values lane, lane + 32, .. (each load reads 128 contiguous bytes),
// the warp folds their magnitudes to the group's maximum (fmaxf skips NaNs), and each lane writes
// its codes of x / s.
#pragma once

#include <cstdint>

#include "cuda/warp_exchange.cuh"
#include "fp8_bits.h"

namespace shardlm::cuda {

// x[0..n) (n <= 128) to codes[0..n); returns the group's scale, the same in every lane. Every lane
// of the warp must call it.
__device__ inline float quantise_group_e4m3(const float* x, int64_t n, uint8_t* codes, int lane) {
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t k = lane + 32 * i;
    v[i] = k < n ? x[k] : 0.0f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_butterfly<FmaxOp>(amax);
  const float s = fp8_bits::act_scale(amax);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t k = lane + 32 * i;
    if (k < n) codes[k] = fp8_bits::from_f32(v[i] / s);
  }
  return s;
}

}  // namespace shardlm::cuda
