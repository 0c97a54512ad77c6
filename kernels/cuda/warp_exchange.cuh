// Warp shuffles of several values at once, and the xor butterfly built on them (every lane ends
// with op over the 32 lanes, combined in the butterfly's fixed order, so a floating-point sum has
// the same bits from run to run).
//
// On the device each value is one __shfl_*_sync, the instructions the loops these replace issued,
// so the results and the code are the same. Over the emulated runtime (kernels/cuda_emu) a batch
// is one warp_collective: the lanes meet once for all the values, where a shuffle each would meet
// once per value. A meeting switches through every lane's fiber, and the emulated kernel tests
// spent over half their time there (a decode GEMM reduces 16 sums a warp: 80 meetings, now 1).
// The collective computes what the shuffles compute, lane by lane, in the same order; like a
// shuffle with a full mask it is a kernel error for a lane to be missing or at another intrinsic.
#pragma once

#include <cuda_runtime.h>

namespace shardlm::cuda {

struct FmaxOp {  // fmaxf's: a NaN operand gives the other
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct FaddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

#ifdef SHARDLM_CUDA_EMULATION
namespace emu_exchange {
template <typename T>
struct XorLane {
  const T* send;
  T* recv;
  int lane_mask;
};
template <int N, typename T>
inline void xor_n(void* const* lanes) {
  T got[32][N];
  for (int l = 0; l < 32; ++l) {
    const auto& me = *static_cast<const XorLane<T>*>(lanes[l]);
    const unsigned from = static_cast<unsigned>(l) ^ static_cast<unsigned>(me.lane_mask);
    const auto& src = *static_cast<const XorLane<T>*>(lanes[from < 32 ? from : l]);  // past the warp: its own
    for (int i = 0; i < N; ++i) got[l][i] = src.send[i];
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < N; ++i) static_cast<const XorLane<T>*>(lanes[l])->recv[i] = got[l][i];
}

template <typename T>
struct FromLane {
  const T* value;
  const int* src;
  T* recv;
};
template <int N, typename T>
inline void from_n(void* const* lanes) {
  T got[32][N];
  for (int l = 0; l < 32; ++l) {
    const auto& me = *static_cast<const FromLane<T>*>(lanes[l]);
    for (int i = 0; i < N; ++i) got[l][i] = *static_cast<const FromLane<T>*>(lanes[me.src[i] & 31])->value;
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < N; ++i) static_cast<const FromLane<T>*>(lanes[l])->recv[i] = got[l][i];
}

template <typename Op, int kLowest, int N, typename T>
inline void butterfly_n(void* const* lanes) {
  T cur[32][N], next[32][N];
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < N; ++i) cur[l][i] = static_cast<const T*>(lanes[l])[i];
  const Op op{};
  for (int o = 16; o >= kLowest; o >>= 1) {
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < N; ++i) next[l][i] = op(cur[l][i], cur[l ^ o][i]);
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < N; ++i) cur[l][i] = next[l][i];
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < N; ++i) static_cast<T*>(lanes[l])[i] = cur[l][i];
}
}  // namespace emu_exchange
#endif

// recv[i] = send[i] of lane (lane ^ lane_mask), for every i; every lane of the warp calls it.
template <int N, typename T>
__device__ inline void shfl_xor_n(const T (&send)[N], T (&recv)[N], int lane_mask) {
#ifdef SHARDLM_CUDA_EMULATION
  emu_exchange::XorLane<T> mine{send, recv, lane_mask};
  ::shardlm_emu::warp_collective(&emu_exchange::xor_n<N, T>, &mine, 0xffffffffu, "__shfl_xor_sync (batched)");
#else
#pragma unroll
  for (int i = 0; i < N; ++i) recv[i] = __shfl_xor_sync(0xffffffffu, send[i], lane_mask);
#endif
}

// recv[i] = value of lane src[i], for every i; every lane of the warp calls it.
template <int N, typename T>
__device__ inline void shfl_from_n(T value, const int (&src)[N], T (&recv)[N]) {
#ifdef SHARDLM_CUDA_EMULATION
  emu_exchange::FromLane<T> mine{&value, src, recv};
  ::shardlm_emu::warp_collective(&emu_exchange::from_n<N, T>, &mine, 0xffffffffu, "__shfl_sync (batched)");
#else
#pragma unroll
  for (int i = 0; i < N; ++i) recv[i] = __shfl_sync(0xffffffffu, value, src[i]);
#endif
}

// Each v[i] becomes op over the warp's v[i]: for o = 16, 8, .. kLowest, v[i] = op(v[i], lane
// (lane ^ o)'s v[i]). With kLowest above 1 the lanes of each aligned group of kLowest are left out
// of one another's results. Every lane of the warp calls it.
template <typename Op, int kLowest = 1, int N, typename T>
__device__ inline void warp_butterfly_n(T (&v)[N]) {
  static_assert(kLowest >= 1 && kLowest <= 16 && (kLowest & (kLowest - 1)) == 0, "a lane bit");
#ifdef SHARDLM_CUDA_EMULATION
  ::shardlm_emu::warp_collective(&emu_exchange::butterfly_n<Op, kLowest, N, T>, v, 0xffffffffu, "xor butterfly");
#else
  const Op op{};
#pragma unroll
  for (int o = 16; o >= kLowest; o >>= 1)
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = op(v[i], __shfl_xor_sync(0xffffffffu, v[i], o));
#endif
}

template <typename Op, int kLowest = 1, typename T>
__device__ inline T warp_butterfly(T v) {
  T one[1] = {v};
  warp_butterfly_n<Op, kLowest>(one);
  return one[0];
}

}  // namespace shardlm::cuda
