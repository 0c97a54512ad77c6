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
// (tests/cuda/test_warp_sum16.cpp): xor_shfl(send, recv, o) sets recv[i] to lane (lane ^ o)'s
// send[i] for each i of the arrays (of 8, 4, 2 or 1); every lane calls it in the same order, as
// warp shuffles require. On the device it is shfl_xor_n (warp_exchange.cuh): a shuffle per value.
#pragma once

#include "host_device.h"

namespace shardlm::cuda::detail {

// Returns sum lane / 2 of the sixteen (p[j] summed over the lanes).
template <class XorShfl>
SHARDLM_HD inline float warp_sum16_pairs(const float (&p)[16], int lane, XorShfl xor_shfl) {
  float send8[8], got8[8], a[8], send4[4], got4[4], b[4], send2[2], got2[2], c[2], send1[1], got1[1];
  const bool b4 = (lane & 16) != 0, b3 = (lane & 8) != 0, b2 = (lane & 4) != 0, b1 = (lane & 2) != 0;
  // o = 16: the lower half-warp keeps sums 0..7, the upper 8..15.
  SHARDLM_UNROLL
  for (int i = 0; i < 8; ++i) send8[i] = b4 ? p[i] : p[8 + i];
  xor_shfl(send8, got8, 16);
  SHARDLM_UNROLL
  for (int i = 0; i < 8; ++i) a[i] = (b4 ? p[8 + i] : p[i]) + got8[i];
  SHARDLM_UNROLL
  for (int i = 0; i < 4; ++i) send4[i] = b3 ? a[i] : a[4 + i];
  xor_shfl(send4, got4, 8);
  SHARDLM_UNROLL
  for (int i = 0; i < 4; ++i) b[i] = (b3 ? a[4 + i] : a[i]) + got4[i];
  SHARDLM_UNROLL
  for (int i = 0; i < 2; ++i) send2[i] = b2 ? b[i] : b[2 + i];
  xor_shfl(send2, got2, 4);
  SHARDLM_UNROLL
  for (int i = 0; i < 2; ++i) c[i] = (b2 ? b[2 + i] : b[i]) + got2[i];
  send1[0] = b1 ? c[0] : c[1];
  xor_shfl(send1, got1, 2);
  const float d = (b1 ? c[1] : c[0]) + got1[0];
  // Lanes 2j and 2j + 1 now hold sum j's two halves; the last step adds them.
  send1[0] = d;
  xor_shfl(send1, got1, 1);
  return d + got1[0];
}

}  // namespace shardlm::cuda::detail
