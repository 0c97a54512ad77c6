// kernels/cuda/warp_exchange.cuh over the emulated runtime, where a batch of shuffles is one
// meeting of the warp: every batched form must give the bits of the one-value shuffles the device
// runs for it, and, as those, name a lane that has exited.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/warp_exchange.cuh"

namespace {

template <class K>
auto launch(K* kernel, const char* name, dim3 grid, dim3 block) {
  return ::shardlm_emu::Launch(::shardlm_emu::fn_key(kernel), name, grid, block, 0) |
         [kernel](auto&... a) { kernel(a...); };
}

std::string last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

// The batched exchanges of kernels/cuda/warp_exchange.cuh, which the emulation runs as one meeting
// of the warp, beside the one-value shuffles the device runs for them: every result must have the
// shuffles' bits. in[] holds 8 values a thread.
__global__ void batched_exchange_kernel(const float* in, float* batched, float* single) {
  using namespace shardlm::cuda;
  const int i = static_cast<int>(threadIdx.x);
  float v[8], got[8];
  for (int k = 0; k < 8; ++k) v[k] = in[8 * i + k];
  float* b = batched + 40 * i;
  float* s = single + 40 * i;
  // xor exchanges, one with a lane mask past the warp (each lane keeps its own).
  shfl_xor_n(v, got, 5);
  for (int k = 0; k < 8; ++k) b[k] = got[k], s[k] = __shfl_xor_sync(0xffffffffu, v[k], 5);
  shfl_xor_n(v, got, 33);
  for (int k = 0; k < 8; ++k) b[8 + k] = got[k], s[8 + k] = __shfl_xor_sync(0xffffffffu, v[k], 33);
  // Value k from lane (3k + lane) % 32.
  const int lane = i & 31;
  const int src[8] = {lane,
                      (3 + lane) % 32,
                      (6 + lane) % 32,
                      (9 + lane) % 32,
                      (12 + lane) % 32,
                      (15 + lane) % 32,
                      (18 + lane) % 32,
                      (21 + lane) % 32};
  shfl_from_n(v[0], src, got);
  for (int k = 0; k < 8; ++k) b[16 + k] = got[k], s[16 + k] = __shfl_sync(0xffffffffu, v[0], src[k]);
  // Butterflies: sums over the warp and over its lane pairs' groups (kLowest 2), maxima.
  float sums[8], pair_sums[4], maxima[4];
  for (int k = 0; k < 8; ++k) sums[k] = v[k];
  for (int k = 0; k < 4; ++k) pair_sums[k] = v[k], maxima[k] = v[4 + k];
  warp_butterfly_n<FaddOp>(sums);
  warp_butterfly_n<FaddOp, 2>(pair_sums);
  warp_butterfly_n<FmaxOp>(maxima);
  for (int k = 0; k < 8; ++k) {
    b[24 + k] = sums[k];
    float t = v[k];
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    s[24 + k] = t;
  }
  for (int k = 0; k < 4; ++k) {
    b[32 + k] = pair_sums[k];
    b[36 + k] = maxima[k];
    float t = v[k], m = v[4 + k];
    for (int o = 16; o > 1; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    s[32 + k] = t;
    s[36 + k] = m;
  }
}

TEST(WarpExchange, BatchedFormsGiveTheShufflesBits) {
  const int n = 64;  // two warps
  std::vector<float> in(8 * n), batched(40 * n, -1), single(40 * n, -2);
  uint32_t x = 12345;
  for (float& v : in) {
    x = x * 1664525u + 1013904223u;
    // Magnitudes 2^-20 .. 2^20 of both signs, so that another order of additions shows.
    v = std::ldexp(1.0f + static_cast<float>(x >> 9) / 8388608.0f, static_cast<int>(x % 41) - 20) *
        ((x >> 8) & 1 ? 1.0f : -1.0f);
  }
  in[8 * 7 + 4] = std::nanf("");  // fmaxf passes a NaN over
  launch(batched_exchange_kernel, "batched_exchange_kernel", 1, n)(in.data(), batched.data(), single.data());
  ASSERT_EQ(last_error(), "");
  for (size_t k = 0; k < batched.size(); ++k)
    ASSERT_EQ(0, std::memcmp(&batched[k], &single[k], sizeof(float)))
        << "thread " << k / 40 << " value " << k % 40 << ": " << batched[k] << " vs " << single[k];
  // The data tell orders apart: a warp's sums differ from the same values summed lane by lane.
  int order_matters = 0;
  for (int w = 0; w < 2; ++w)
    for (int k = 0; k < 8; ++k) {
      float sequential = 0.0f;
      for (int l = 0; l < 32; ++l) sequential += in[8 * (32 * w + l) + k];
      order_matters += sequential != batched[40 * 32 * w + 24 + k];
    }
  EXPECT_GT(order_matters, 4);
}

// A batched exchange is a full-warp intrinsic like the shuffles it stands for.
__global__ void exited_lane_butterfly_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  float v[2] = {1.0f, 2.0f};
  shardlm::cuda::warp_butterfly_n<shardlm::cuda::FaddOp>(v);
  out[threadIdx.x] = v[0];
}

TEST(WarpExchange, ExitedLaneIsReported) {
  std::vector<float> out(32, 0);
  launch(exited_lane_butterfly_kernel, "exited_lane_butterfly_kernel", 1, 32)(out.data());
  const std::string e = last_error();
  EXPECT_NE(e.find("has exited"), std::string::npos) << e;
  EXPECT_NE(e.find("xor butterfly"), std::string::npos) << e;
}

}  // namespace
