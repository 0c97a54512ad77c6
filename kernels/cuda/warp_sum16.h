// Sixteen warp sums at once, each with the bits of the xor butterfly (block_reduce.cuh warp_sum).
//
// The butterfly sums one value over the 32 lanes in 5 shuffle-and-add steps, lane l adding lane
// l ^ o for o = 16, 8, 4, 2, 1; sixteen of them cost 80 shuffles and 80 additions per lane. Here
// each step still adds lane l ^ o to lane l, but a lane keeps only the half of its values the
// step's lane bit picks and ships the other half to its partner, which keeps that half: 8 + 4 + 2
// + 1 + 1 shuffles and as many additions, after which lanes 2j and 2j + 1 hold sum j. Each value a
// lane holds is, at every step, exactly the butterfly's for that sum (the same two operands, and
// a + b == b + a), so the sums carry the butterfly's bits. The sums are left where they end: a
// caller that needs one per position (the attention kernels' weights) computes it once, in the
// lanes that hold it, rather than in every lane.
//
// Written over a shuffle callable so that the host can run the same code on 32 emulated lanes
// (tests/cuda/test_warp_sum16.cpp): xor_shfl(v, o) returns lane (lane ^ o)'s v; every lane calls
// it in the same order, as warp shuffles require.
#pragma once

#include "host_device.h"

namespace shardlm::cuda::detail {

// Returns sum lane / 2 of the sixteen (p[j] summed over the lanes).
template <class XorShfl>
SHARDLM_HD inline float warp_sum16_pairs(const float (&p)[16], int lane, XorShfl xor_shfl) {
  float a[8], b[4], c[2];
  const bool b4 = (lane & 16) != 0, b3 = (lane & 8) != 0, b2 = (lane & 4) != 0, b1 = (lane & 2) != 0;
  // o = 16: the lower half-warp keeps sums 0..7, the upper 8..15.
  SHARDLM_UNROLL
  for (int i = 0; i < 8; ++i) a[i] = (b4 ? p[8 + i] : p[i]) + xor_shfl(b4 ? p[i] : p[8 + i], 16);
  SHARDLM_UNROLL
  for (int i = 0; i < 4; ++i) b[i] = (b3 ? a[4 + i] : a[i]) + xor_shfl(b3 ? a[i] : a[4 + i], 8);
  SHARDLM_UNROLL
  for (int i = 0; i < 2; ++i) c[i] = (b2 ? b[2 + i] : b[i]) + xor_shfl(b2 ? b[i] : b[2 + i], 4);
  const float d = (b1 ? c[1] : c[0]) + xor_shfl(b1 ? c[0] : c[1], 2);
  // Lanes 2j and 2j + 1 now hold sum j's two halves; the last step adds them.
  return d + xor_shfl(d, 1);
}

}  // namespace shardlm::cuda::detail
