// The warp-level fp8 tensor core product of the grouped W8A8 GEMM: mma.sync m16n8k32 with e4m3
// operands and fp32 accumulation (sm_89 and later). On Hopper it runs on the f16 tensor cores
// (below): its fp8 rate is wgmma's alone, so this product's ceiling there is the bf16/f16 peak.
//
// Fragments, as the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k32" with 8-bit types),
// g = lane / 4, c = lane % 4; each 32-bit register holds four e4m3 codes, the lowest column (or
// row of B) in the low byte:
//   A (16 x 32, row major): a[0] = A[g][4c .. 4c+3],     a[1] = A[g+8][4c .. 4c+3],
//                           a[2] = A[g][4c+16 .. 4c+19], a[3] = A[g+8][4c+16 .. 4c+19]
//   B (32 x 8):             b[0] = B[4c .. 4c+3][g],     b[1] = B[4c+16 .. 4c+19][g]
//   C, D (16 x 8, fp32):    d[0], d[1] = D[g][2c, 2c+1], d[2], d[3] = D[g+8][2c, 2c+1]
// In bytes this is mma_bf16.cuh's m16n8k16 layout: a 32-bit word at byte 4c of row g (A) or of
// column g (B, stored column-major: a weight row [N][K]) is the register, so a row-major A tile
// and a weight tile in shared memory load with one 32-bit read per register.
//
// Over the emulated runtime the product is one warp-collective operation, as mma_bf16.cuh's:
// the fragments gathered, each 32-term dot product of codes summed in fp32 (an e4m3 x e4m3
// product is exact there) and added to d, so a misplaced fragment element gives a wrong product.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/convert_pairs.cuh"
#include "fp8_bits.h"

namespace shardlm::cuda::detail {

#ifdef SHARDLM_CUDA_EMULATION
struct MmaFp8Lane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
};
inline float emu_e4m3(uint32_t reg, int byte) { return fp8_bits::to_f32(static_cast<uint8_t>(reg >> (8 * byte))); }
// SHARDLM_EMU_MMA_FP8_SWAPPED_K=1: A's two 16-column halves read from each other's registers, a
// tensor core that lays fragments out otherwise than the code assumes (the backend's self-check).
inline bool emu_mma_fp8_swapped() {
  const char* e = std::getenv("SHARDLM_EMU_MMA_FP8_SWAPPED_K");
  return e != nullptr && std::strcmp(e, "1") == 0;
}
inline void emu_mma_e4m3_16832(void* const* lanes) {
  float A[16][32], B[32][8];
  const int lo = emu_mma_fp8_swapped() ? 16 : 0, hi = 16 - lo;
  for (int lane = 0; lane < 32; ++lane) {
    const MmaFp8Lane& l = *static_cast<const MmaFp8Lane*>(lanes[lane]);
    const int g = lane / 4, c = lane % 4;
    for (int j = 0; j < 4; ++j) {
      A[g][4 * c + lo + j] = emu_e4m3(l.a[0], j);
      A[g + 8][4 * c + lo + j] = emu_e4m3(l.a[1], j);
      A[g][4 * c + hi + j] = emu_e4m3(l.a[2], j);
      A[g + 8][4 * c + hi + j] = emu_e4m3(l.a[3], j);
      B[4 * c + j][g] = emu_e4m3(l.b[0], j);
      B[4 * c + 16 + j][g] = emu_e4m3(l.b[1], j);
    }
  }
  float S[16][8];
  ::shardlm_emu::mma_tile_sums(A, B, S);
  for (int lane = 0; lane < 32; ++lane) {
    const MmaFp8Lane& l = *static_cast<const MmaFp8Lane*>(lanes[lane]);
    const int g = lane / 4, c = lane % 4;
    for (int e = 0; e < 4; ++e) l.d[e] += S[g + 8 * (e / 2)][2 * c + e % 2];
  }
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
__device__ inline void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// d += a * b over one m16n8k32 tile of e4m3 codes; every lane of the warp calls it together.
//
// Hopper has no e4m3 mma.sync (its fp8 tensor cores are wgmma's): ptxas lowers the instruction to
// the codes converted to f16 pairs, two f16 m16n8k16 products summed from zero, and an fp32 add per
// element into d (sm_90a SASS, nvcc 13.0). There this does the same conversion and products but
// accumulates both into d, which leaves out the adds: 128 of the 610 instructions of a grouped
// GEMM step. The two products take each register's low code pair, then its high pair: the same
// permutation of the 32 k of A and of B, so their sum is the tile's (every e4m3 product is exact in
// the fp32 accumulation, as on a native fp8 mma). The conversions are pure, so a fragment used
// by several products is converted once.
__device__ inline void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef SHARDLM_CUDA_EMULATION
  MmaFp8Lane mine{d, a, b};
  ::shardlm_emu::warp_collective(&emu_mma_e4m3_16832, &mine, 0xffffffffu, "mma.sync.m16n8k32.e4m3");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  const uint32_t alo[4] = {e4m3x2_to_f16x2<0>(a[0]), e4m3x2_to_f16x2<0>(a[1]), e4m3x2_to_f16x2<0>(a[2]),
                           e4m3x2_to_f16x2<0>(a[3])};
  const uint32_t blo[2] = {e4m3x2_to_f16x2<0>(b[0]), e4m3x2_to_f16x2<0>(b[1])};
  mma_f16_16816(d, alo, blo);
  const uint32_t ahi[4] = {e4m3x2_to_f16x2<1>(a[0]), e4m3x2_to_f16x2<1>(a[1]), e4m3x2_to_f16x2<1>(a[2]),
                           e4m3x2_to_f16x2<1>(a[3])};
  const uint32_t bhi[2] = {e4m3x2_to_f16x2<1>(b[0]), e4m3x2_to_f16x2<1>(b[1])};
  mma_f16_16816(d, ahi, bhi);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

}  // namespace shardlm::cuda::detail
