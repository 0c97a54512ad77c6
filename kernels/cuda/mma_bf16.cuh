// The warp-level tensor core product the attention kernels use: mma.sync m16n8k16 with bf16
// operands and fp32 accumulation (sm_80 and later; on Hopper it runs on the same tensor cores
// as wgmma, at a lower share of their peak), and the bf16 packing of its operands.
//
// Fragments, as the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16 with floating point
// type"), with g = lane / 4 and c = lane % 4; each 32-bit register holds two bf16, the lower
// column (or row of B) in the low half:
//   A (16 x 16, row major): a[0] = A[g][2c, 2c+1], a[1] = A[g+8][2c, 2c+1],
//                           a[2] = A[g][2c+8, 2c+9], a[3] = A[g+8][2c+8, 2c+9]
//   B (16 x 8):             b[0] = B[2c, 2c+1][g],  b[1] = B[2c+8, 2c+9][g]
//   C, D (16 x 8, fp32):    d[0], d[1] = D[g][2c, 2c+1], d[2], d[3] = D[g+8][2c, 2c+1]
// So an accumulator tile pair D0 | D1 (16 x 16) is, packed to bf16, exactly the A fragment of the
// next product: {D0[0..1], D0[2..3], D1[0..1], D1[2..3]} (what flash attention does with P).
//
// Over the emulated runtime the product is one warp-collective operation (cuda_runtime.h's
// warp_collective): the whole warp's fragments are gathered, multiplied in fp32 (a bf16 x bf16
// product is exact in fp32) and scattered back in the same layout, so a kernel that misplaces a
// fragment element gets a wrong product there as on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "bf16_bits.h"
#include "cuda/convert_pairs.cuh"

namespace shardlm::cuda::detail {

// Two floats as bf16 (round to nearest even, as kernels/bf16_bits.h and the CPU round), lo in the
// low half: one conversion instruction (convert_pairs.cuh).
__device__ inline uint32_t pack_bf16x2(float lo, float hi) { return f32x2_to_bf16x2(lo, hi); }

#ifdef SHARDLM_CUDA_EMULATION
struct MmaLane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
};
inline float emu_bf16(uint32_t reg, int half) { return bf16_bits::to_f32(static_cast<uint16_t>(reg >> (16 * half))); }
inline void emu_mma_bf16_16816(void* const* lanes) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const MmaLane& l = *static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, c = lane % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * c + h] = emu_bf16(l.a[0], h);
      A[g + 8][2 * c + h] = emu_bf16(l.a[1], h);
      A[g][2 * c + 8 + h] = emu_bf16(l.a[2], h);
      A[g + 8][2 * c + 8 + h] = emu_bf16(l.a[3], h);
      B[2 * c + h][g] = emu_bf16(l.b[0], h);
      B[2 * c + 8 + h][g] = emu_bf16(l.b[1], h);
    }
  }
  float S[16][8];
  ::shardlm_emu::mma_tile_sums(A, B, S);
  for (int lane = 0; lane < 32; ++lane) {
    const MmaLane& l = *static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, c = lane % 4;
    for (int e = 0; e < 4; ++e) l.d[e] += S[g + 8 * (e / 2)][2 * c + e % 2];
  }
}
#endif

// d += a * b over one m16n8k16 tile; every lane of the warp calls it together.
__device__ inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef SHARDLM_CUDA_EMULATION
  MmaLane mine{d, a, b};
  ::shardlm_emu::warp_collective(&emu_mma_bf16_16816, &mine, 0xffffffffu, "mma.sync.m16n8k16.bf16");
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

}  // namespace shardlm::cuda::detail
