// A warp's tensor-core fragments from shared memory in one instruction (ldmatrix, sm_75 and later)
// instead of a 32-bit load per fragment register: four 8 x 8 matrices of 16-bit elements, each row
// 16 contiguous bytes anywhere in shared memory (16-byte aligned). Lane l names row l % 8 of
// matrix l / 8; register i of every lane then holds a word of matrix i:
//   ldmatrix_x4:       lane l gets row l / 4, bytes 4 (l % 4) .. +4, i.e. elements 2c, 2c + 1 of
//                      row g (g = l / 4, c = l % 4): mma_bf16.cuh's A and B fragment word, and in
//                      bytes mma_fp8.cuh's (four e4m3 codes);
//   ldmatrix_x4_trans: lane l gets elements [2c][g] (low half) and [2c + 1][g]: the same word of
//                      the transposed matrix, so a B operand stored row-major ([k][n], e.g. an
//                      attention round's values [position][dim]) loads as the fragment of B.
// On the device each 8-row phase reads 128 bytes; rows 4 banks apart (a row pitch of 16 mod 128
// bytes) read without conflicts.
//
// Over the emulated runtime it is one warp-collective operation (cuda_runtime.h's warp_collective):
// the rows every lane names are read when the whole warp has arrived, as the device reads them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace shardlm::cuda::detail {

#ifdef SHARDLM_CUDA_EMULATION
struct LdmatrixLane {
  uint32_t* r;
  const void* row;
};
template <bool Trans>
inline void emu_ldmatrix_x4(void* const* lanes) {
  const uint8_t* rows[32];
  for (int l = 0; l < 32; ++l) {
    rows[l] = static_cast<const uint8_t*>(static_cast<const LdmatrixLane*>(lanes[l])->row);
    if (reinterpret_cast<uintptr_t>(rows[l]) % 16 != 0)
      throw std::runtime_error("ldmatrix: lane " + std::to_string(l) + " names a row not 16-byte aligned");
    if (!::shardlm_emu::in_shared(rows[l], 16))
      throw std::runtime_error("ldmatrix: lane " + std::to_string(l) + " names a row outside shared memory");
  }
  auto elem = [&](int matrix, int row, int col) {
    uint16_t e;
    std::memcpy(&e, rows[8 * matrix + row] + 2 * col, sizeof e);
    return static_cast<uint32_t>(e);
  };
  for (int l = 0; l < 32; ++l) {
    uint32_t* r = static_cast<const LdmatrixLane*>(lanes[l])->r;
    const int g = l / 4, c = l % 4;
    for (int i = 0; i < 4; ++i)
      r[i] = Trans ? elem(i, 2 * c, g) | elem(i, 2 * c + 1, g) << 16 : elem(i, g, 2 * c) | elem(i, g, 2 * c + 1) << 16;
  }
}
#endif

// Every lane of the warp calls these together, row: its row's shared-memory address.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#ifdef SHARDLM_CUDA_EMULATION
  LdmatrixLane mine{r, row};
  ::shardlm_emu::warp_collective(&emu_ldmatrix_x4<false>, &mine, 0xffffffffu, "ldmatrix.x4");
#else
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#ifdef SHARDLM_CUDA_EMULATION
  LdmatrixLane mine{r, row};
  ::shardlm_emu::warp_collective(&emu_ldmatrix_x4<true>, &mine, 0xffffffffu, "ldmatrix.x4.trans");
#else
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

}  // namespace shardlm::cuda::detail
