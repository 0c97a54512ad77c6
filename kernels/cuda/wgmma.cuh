// Hopper's warpgroup tensor-core products (wgmma.mma_async, sm_90a): the 4 warps of a warpgroup
// (128 threads from a multiple of 128) compute a 64 x N tile together, both operands read straight
// from shared memory through 64-bit descriptors, asynchronously: the product is issued, committed
// into a group and waited for, and until then neither its accumulators nor its shared memory may be
// touched. It is the only way to Hopper's fp8 rate (mma.sync has no e4m3 product there: mma_fp8.cuh)
// and to the bf16 rate cuBLAS reaches: no register holds an operand, so a product of 64 x 64 x 16
// costs its warps one instruction where mma.sync takes 32 products and their fragment loads.
//
// Operands (PTX ISA, "Shared Memory Matrix Layout", K-major with the 128-byte swizzle): rows of 128
// bytes (64 bf16 or 128 e4m3 features), 8-row atoms of 1024 bytes one after the other, atoms
// 1024-byte aligned in the shared window; row r's 16-byte chunk j lies at chunk j ^ (r % 8) of its
// row (swizzled_chunk), so a copy of 8 rows' chunk j and the tensor cores' read of a k-slice of 8
// rows each fall in distinct banks. A product reads a 32-byte k-slice of every row (16 bf16, 32
// e4m3): its descriptor's start is the first row plus the slice's byte offset, the swizzle being a
// function of the address (bits 4-6 XOR bits 7-9).
//
// Accumulators (m64nNk*, fp32): warp q of the warpgroup holds rows 16 q.. 16 q + 15; lane l (g =
// l / 4, c = l % 4) holds d[4 j + e] = D[16 q + g + 8 (e / 2)][8 j + 2 c + e % 2], mma.sync's
// m16n8 layout once per 8 outputs.
//
// Over the emulated runtime a product is a warp-collective operation queued for the warp (each warp
// computes its own 16 rows, all the device's warps of a warpgroup compute) and run when a wait lets
// it (cuda_runtime.h's warp_async_wait): the operands are read then, through the descriptor and the
// swizzle as the device reads them, and the accumulators written then, so a kernel that refills a
// stage or reads its accumulators before waiting gets a wrong result here too.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bf16_bits.h"
#include "fp8_bits.h"
#ifdef SHARDLM_CUDA_EMULATION
#include "cuda/mma_fp8.cuh"  // emu_mma_fp8_swapped: the backend self-check's misreading switch
#endif

namespace shardlm::cuda::detail {

constexpr int kWgmmaRowBytes = 128, kWgmmaAtomBytes = 1024;

// Bytes from a tile's first row to chunk j (16 bytes) of its row r.
__device__ inline int swizzled_chunk(int r, int j) { return r * kWgmmaRowBytes + 16 * (j ^ (r & 7)); }

// p's address in the shared window (the emulated runtime's dynamic shared memory starts at 0).
__device__ inline uint32_t shared_window_address(const void* p) {
#ifdef SHARDLM_CUDA_EMULATION
  return ::shardlm_emu::shared_address(p);
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// The first address of smem (dynamic shared memory) that is 1024-byte aligned in the shared window,
// where swizzled operands may start (a kernel allocates kWgmmaAtomBytes more for the slack).
__device__ inline uint8_t* wgmma_aligned(uint8_t* smem) {
  return smem + ((kWgmmaAtomBytes - shared_window_address(smem) % kWgmmaAtomBytes) % kWgmmaAtomBytes);
}

// The descriptor of a K-major, 128-byte-swizzled operand whose first row's k-slice starts at
// shared-window address addr: start address >> 4 (bits 0-13); leading byte offset unused by swizzled
// K-major operands (1, bits 16-29); stride byte offset 1024 >> 4, from one 8-row atom to the next
// (bits 32-45); base offset 0 (atoms aligned); swizzle mode 1, 128 bytes (bits 62-63).
__device__ inline uint64_t wgmma_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | uint64_t{1} << 16 |
         static_cast<uint64_t>(kWgmmaAtomBytes >> 4) << 32 | uint64_t{1} << 62;
}

#ifdef SHARDLM_CUDA_EMULATION
struct WgmmaLane {
  float* d;
  uint64_t a, b;
  bool accumulate;
};

// SHARDLM_EMU_WGMMA_UNSWIZZLED=1: operands read as if stored without the swizzle, a tensor core that
// reads shared memory otherwise than the kernels lay it out (the backend's self-check).
inline bool emu_wgmma_unswizzled() {
  const char* e = std::getenv("SHARDLM_EMU_WGMMA_UNSWIZZLED");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

// The shared memory a descriptor's operand has at row r, byte kb of its k-slice.
inline const unsigned char* emu_wgmma_operand(uint64_t desc, int r, int kb, int slice_bytes, bool unswizzled) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3fffu) << 4;
  const uint32_t stride = static_cast<uint32_t>((desc >> 32) & 0x3fffu) << 4;
  if (desc >> 62 != 1 || ((desc >> 49) & 7u) != 0)
    throw std::runtime_error("wgmma: a descriptor other than the 128-byte swizzle at base offset 0");
  if ((start & 0x7fu) + static_cast<uint32_t>(slice_bytes) > kWgmmaRowBytes || (start & 0x380u) != 0)
    throw std::runtime_error("wgmma: a k-slice at shared address " + std::to_string(start) +
                             " not within the first row of a 1024-byte swizzle atom");
  const uint32_t at = start + static_cast<uint32_t>(r / 8) * stride + static_cast<uint32_t>(r % 8) * kWgmmaRowBytes +
                      static_cast<uint32_t>(kb);
  return ::shardlm_emu::shared_at(unswizzled ? at : at ^ (((at >> 7) & 7u) << 4), 1);
}

// One warp's 16 rows of a 64 x 64 product over a k-slice of Elem (bf16: 16 features, e4m3: 32),
// queued to run at a wait.
template <bool Fp8>
inline void emu_wgmma_m64n64(void* const* lanes) {
  const auto& l0 = *static_cast<const WgmmaLane*>(lanes[0]);
  std::array<float*, 32> d{};
  for (int l = 0; l < 32; ++l) {
    const auto& m = *static_cast<const WgmmaLane*>(lanes[l]);
    if (m.a != l0.a || m.b != l0.b || m.accumulate != l0.accumulate)
      throw std::runtime_error("wgmma: the lanes of a warp name different operands");
    d[l] = m.d;
  }
  if (::shardlm_emu::block_dim().y != 1 || ::shardlm_emu::block_dim().x % 128 != 0)
    throw std::runtime_error("wgmma in a block that is not whole warpgroups along x");
  const int q = static_cast<int>(::shardlm_emu::thread_idx().x / 32 % 4);
  const bool swapped = Fp8 && emu_mma_fp8_swapped(), unswizzled = emu_wgmma_unswizzled();
  // The 1024-byte atoms it reads: the warp's 16 rows of A, B's 64.
  std::vector<std::pair<uint32_t, uint32_t>> reads;
  auto atoms = [&reads](uint64_t desc, int first, int rows) {
    const uint32_t start = (static_cast<uint32_t>(desc & 0x3fffu) << 4) & ~0x3ffu;
    const uint32_t stride = static_cast<uint32_t>((desc >> 32) & 0x3fffu) << 4;
    for (int r = first; r < first + rows; r += 8) {
      const uint32_t at = start + static_cast<uint32_t>(r / 8) * stride;
      reads.emplace_back(at, at + kWgmmaAtomBytes);
    }
  };
  atoms(l0.a, 16 * q, 16);
  atoms(l0.b, 0, 64);
  ::shardlm_emu::warp_async_push(
      [d, a = l0.a, b = l0.b, acc = l0.accumulate, q, swapped, unswizzled] {
        constexpr int kK = Fp8 ? 32 : 16, kSize = Fp8 ? 1 : 2;
        auto value = [](const unsigned char* p) {
          if constexpr (Fp8) {
            return fp8_bits::to_f32(*p);
          } else {
            return bf16_bits::to_f32(static_cast<uint16_t>(p[0] | p[1] << 8));
          }
        };
        float A[16][kK], B[64][kK];
        for (int r = 0; r < 16; ++r)
          for (int k = 0; k < kK; ++k)
            A[r][swapped ? k ^ 16 : k] = value(emu_wgmma_operand(a, 16 * q + r, kSize * k, 32, unswizzled));
        for (int n = 0; n < 64; ++n)
          for (int k = 0; k < kK; ++k) B[n][k] = value(emu_wgmma_operand(b, n, kSize * k, 32, unswizzled));
        for (int l = 0; l < 32; ++l)
          for (int i = 0; i < 32; ++i) {
            const int row = l / 4 + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
            float sum = 0.0f;
            for (int k = 0; k < kK; ++k) sum += A[row][k] * B[col][k];
            d[l][i] = acc ? d[l][i] + sum : sum;
          }
      },
      std::move(reads));
}
inline void emu_wgmma_commit(void* const*) { ::shardlm_emu::warp_async_commit(); }
template <int Pending>
inline void emu_wgmma_wait(void* const*) {
  ::shardlm_emu::warp_async_wait(Pending);
}
#endif

// Before a warpgroup's first product and whenever its accumulators were written by other
// instructions since: orders those writes before the products (wgmma.fence).
__device__ inline void wgmma_fence() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(SHARDLM_CUDA_EMULATION)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// Shared memory written by this thread's ordinary and cp.async stores becomes visible to the
// products' reads (which go through the async proxy); a barrier then makes it every thread's.
__device__ inline void fence_shared_for_wgmma() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(SHARDLM_CUDA_EMULATION)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Closes the group of products the warpgroup issued since the last commit.
__device__ inline void wgmma_commit() {
#ifdef SHARDLM_CUDA_EMULATION
  ::shardlm_emu::warp_collective(&emu_wgmma_commit, nullptr, 0xffffffffu, "wgmma.commit_group");
#elif defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most Pending of the warpgroup's committed groups, the newest, are in flight. The
// compiler must not move the accumulators' reads above it: wgmma_hold.
template <int Pending>
__device__ inline void wgmma_wait() {
#ifdef SHARDLM_CUDA_EMULATION
  ::shardlm_emu::warp_collective(&emu_wgmma_wait<Pending>, nullptr, 0xffffffffu, "wgmma.wait_group");
#elif defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}

// Pins the accumulators in place around the asynchronous products: the compiler sees them read and
// written here, so it neither moves their uses across a wait nor keeps a copy.
template <int N>
__device__ inline void wgmma_hold(float (&d)[N]) {
#if defined(__CUDA_ARCH__) && !defined(SHARDLM_CUDA_EMULATION)
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
  (void)d;
#endif
}

#define SHARDLM_WGMMA_D32                                                                                     \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SHARDLM_WGMMA_D32_REGS                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"

// d = (accumulate ? d : 0) + A B^T over a 16-feature bf16 k-slice: A the warpgroup's 64 rows, B 64
// outputs' weight rows, both at descriptors (wgmma_desc). Every thread of the warpgroup calls it.
__device__ inline void wgmma_bf16_m64n64k16(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
#ifdef SHARDLM_CUDA_EMULATION
  WgmmaLane mine{d, a, b, accumulate};
  ::shardlm_emu::warp_collective(&emu_wgmma_m64n64<false>, &mine, 0xffffffffu, "wgmma.m64n64k16.bf16");
#elif defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SHARDLM_WGMMA_D32_REGS ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : SHARDLM_WGMMA_D32
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
#endif
}

// The same over a 32-feature e4m3 k-slice (fp32 accumulation as the fp8 tensor cores keep it).
__device__ inline void wgmma_e4m3_m64n64k32(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
#ifdef SHARDLM_CUDA_EMULATION
  WgmmaLane mine{d, a, b, accumulate};
  ::shardlm_emu::warp_collective(&emu_wgmma_m64n64<true>, &mine, 0xffffffffu, "wgmma.m64n64k32.e4m3");
#elif defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " SHARDLM_WGMMA_D32_REGS ", %32, %33, p, 1, 1;\n}\n"
      : SHARDLM_WGMMA_D32
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
#endif
}

#undef SHARDLM_WGMMA_D32
#undef SHARDLM_WGMMA_D32_REGS

}  // namespace shardlm::cuda::detail
