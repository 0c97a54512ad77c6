// Linear layers over a few activation rows (decode steps), read straight from the weights: fp8 e4m3
// with block scales dequantised in registers as they are read (one byte a weight from memory), and,
// for the device-routed grouped call, bf16 or fp32 weights too.
//
//   y[m, n] = sum_k x[m, k] * w(n, k),  w(n, k) = bf16(fp32(code[n, k]) * scale(n, k))
//
// w(n, k) is the value model/fp8_block.h's dequantisation gives the weight (NaN codes and NaN or
// infinite scales included), so this is a GEMM against the dequantised bf16 matrix. x holds bf16
// bit patterns (the activations rounded as for a bf16 GEMM), so every product is exact in fp32.
// Sums are fp32 in an order that depends on K and the weight's layout only, never on M: lane l of
// a warp adds its products in increasing k, then the 32 lane sums meet in a fixed butterfly. A
// row's result is the same whatever rows share the call (batch invariant).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// An fp8 weight [N, K] on the device (see compute/backend.h's Fp8Blocks): code (n, k) at
// codes[n * K + k]; its scale scale_inv[((n + row_off) / block_rows) * scale_cols +
// (k + col_off) / block_cols].
struct Fp8Weight {
  const uint8_t* codes = nullptr;
  const float* scale_inv = nullptr;
  int64_t N = 0, K = 0;
  int64_t scale_cols = 0, block_rows = 0, block_cols = 0, row_off = 0, col_off = 0;
};

// Activation rows a launch takes at once; more rows take several passes over the weight.
constexpr int64_t kFp8MatmulRowsPerPass = 8;

// y [M, N] (row-major, fp32) from x [M, K] (bf16 bits, row-major). The 16-byte path (K and
// block_cols multiples of 16, block_cols a power of two, col_off a multiple of 16, codes and x
// 16-byte aligned) reads 16 codes per lane and load; any other weight takes a one-code-per-lane path
// with the same values.
void launch_fp8_matmul(const uint16_t* x_bf16, int64_t M, const Fp8Weight& w, float* y, cudaStream_t stream);

// Whether launch_fp8_matmul takes the 16-byte path for this weight and x (tests, benchmarks).
bool fp8_matmul_vectorised(const Fp8Weight& w, const uint16_t* x_bf16);

// One pass of a grouped call: rows [row0, row0 + rows) of x and y (rows <= kFp8MatmulRowsPerPass)
// times one weight (fp8 codes and their scales, or bf16 / fp32 values with no scales).
struct Fp8MatmulPass {
  const void* weight;
  const float* scale_inv;
  int64_t row0;
  int32_t rows;
};

// Several weights of one shape and block layout (shape's N, K and scale geometry; its codes and
// scale_inv are unused), each over its own rows, in one launch (Mixture-of-Experts decode: every
// local expert's projection): passes (device memory) lists n_passes passes of at most max_rows
// rows. Each row gets the bits launch_fp8_matmul gives it. `vectorised`: the 16-byte path, which
// fp8_matmul_vectorised must allow for every pass's codes (and x).
void launch_fp8_grouped_matmul(const uint16_t* x_bf16, const Fp8MatmulPass* passes, int64_t n_passes, int max_rows,
                               const Fp8Weight& shape, bool vectorised, float* y, cudaStream_t stream);

// ---- Device-routed grouped call (Mixture-of-Experts steps captured in a CUDA graph) ----
//
// The groups' row ranges are in device memory (an expert permutation's offsets), so neither the
// launch nor the pass list depends on the host knowing them: a one-block kernel turns the offsets
// into passes of up to kFp8MatmulRowsPerPass rows, and the matmul's grid covers the most passes
// max_rows rows in G groups can take, its surplus blocks returning at once.

enum class RowsWeight { kFp8, kBf16, kF32 };

// Group g's weight: fp8 codes and scales (kFp8), or bf16 / fp32 values (scale_inv null).
struct RoutedWeight {
  const void* weight;
  const float* scale_inv;
};

// Passes the pass list must hold for max_rows rows in G groups (the launch's grid).
int64_t routed_matmul_max_passes(int64_t max_rows, int64_t G);

// For g < G: rows [offsets[g], offsets[g + 1]) of y [max_rows, N] = the same rows of x times
// weights[g]^T; rows from offsets[G] (<= max_rows) on are not written. offsets [G + 1] and weights
// [G] in device memory; `shape` gives N, K and (kFp8) the scale geometry every group shares. x holds
// bf16 bits (kFp8, kBf16) or fp32 (kF32), [max_rows, K]. passes (routed_matmul_max_passes entries)
// and n_passes (one int) are device workspace. Each row's sum runs in launch_fp8_matmul's order
// (lanes over K, then the butterfly), so for fp8 weights a row gets the bits launch_fp8_matmul
// gives it. `vectorised`: the 16-byte path, which routed_matmul_vectorised must allow for every
// group's weight.
void launch_routed_matmul(const void* x, int64_t max_rows, const int32_t* offsets, int64_t G,
                          const RoutedWeight* weights, const Fp8Weight& shape, RowsWeight format, bool vectorised,
                          Fp8MatmulPass* passes, int32_t* n_passes, float* y, cudaStream_t stream);

// Whether the 16-byte path can read this weight and x: fp8 as fp8_matmul_vectorised; bf16 and fp32
// K a multiple of 16 and both 16-byte aligned.
bool routed_matmul_vectorised(const Fp8Weight& shape, RowsWeight format, const void* weight, const void* x);

}  // namespace shardlm::cuda
