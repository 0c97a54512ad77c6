#include "cuda/wire_fp8.h"

#include <cstdint>

#include "bf16_bits.h"
#include "cpu/wire_fp8.h"
#include "cuda/fp8_group_quant.cuh"
#include "fp8_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kWarps = 8;
constexpr unsigned kMaxGridY = 65535;
constexpr int64_t kWholePerWarp = 128;  // whole words a warp moves: 4 a lane

// A warp per unit of a block (grid-stride): x over a block's units, y over the blocks. Units
// [0, rows * groups) are the rows' 128-value groups, quantised as kernels/cuda/fp8_act_quant.cu
// quantises (fp8_group_quant.cuh); the units after them move the whole words, 128 a warp.
// kPack: block to the wire; else the wire back to the block.
template <bool kPack>
__global__ void wire_fp8_kernel(const void* __restrict__ src, int64_t blocks, int64_t block_len, int64_t round_len,
                                int64_t row_len, void* __restrict__ dst) {
  const int64_t groups = cpu::wire_fp8_groups(row_len), row_bytes = cpu::wire_fp8_row_bytes(row_len);
  const int64_t rows = round_len / row_len, wire = cpu::wire_fp8_bytes(block_len, round_len, row_len);
  const int64_t whole = block_len - round_len, quant_units = rows * groups;
  const int64_t units = quant_units + (whole + kWholePerWarp - 1) / kWholePerWarp;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    float* words = static_cast<float*>(kPack ? const_cast<void*>(src) : dst) + b * block_len;
    uint8_t* packed = static_cast<uint8_t*>(kPack ? dst : const_cast<void*>(src)) + b * wire;
    for (int64_t u = first; u < units; u += stride) {  // the same u for a whole warp: whole warps leave
      if (u >= quant_units) {
        const int64_t j0 = (u - quant_units) * kWholePerWarp;
        uint32_t* w = reinterpret_cast<uint32_t*>(packed + rows * row_bytes);
        uint32_t* f = reinterpret_cast<uint32_t*>(words + round_len);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t j = j0 + lane + 32 * i;
          if (j < whole) {
            if (kPack) {
              w[j] = f[j];
            } else {
              f[j] = w[j];
            }
          }
        }
        continue;
      }
      const int64_t r = u / groups, g = u % groups, k0 = g * cpu::kWireFp8Group;
      float* x = words + r * row_len;
      uint8_t* row = packed + r * row_bytes;
      uint8_t* codes = row + 4 * groups;
      float* scale = reinterpret_cast<float*>(row) + g;
      if (kPack) {
        const int64_t n = row_len - k0 < cpu::kWireFp8Group ? row_len - k0 : cpu::kWireFp8Group;
        const float s = quantise_group_e4m3(x + k0, n, codes + k0, lane);
        if (lane == 0) *scale = s;
        // The last group zeroes the row's padding, so the wire holds no stale bytes.
        if (g == groups - 1 && row_len + lane < row_bytes - 4 * groups) codes[row_len + lane] = 0;
      } else {
        const float s = *scale;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t k = k0 + lane + 32 * i;
          if (k < row_len) x[k] = fp8_bits::to_f32(codes[k]) * s;
        }
      }
    }
  }
}

template <bool kPack>
void launch(const void* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, void* dst,
            cudaStream_t stream) {
  if (blocks <= 0 || block_len <= 0) return;
  const int64_t rows = row_len > 0 ? round_len / row_len : 0;
  const int64_t units = rows * cpu::wire_fp8_groups(row_len > 0 ? row_len : 1) +
                        (block_len - round_len + kWholePerWarp - 1) / kWholePerWarp;
  const int64_t x = (units + kWarps - 1) / kWarps;
  const dim3 grid(static_cast<unsigned>(x < 1024 ? x : 1024),
                  static_cast<unsigned>(blocks < kMaxGridY ? blocks : kMaxGridY));
  wire_fp8_kernel<kPack>
      <<<grid, kWarps * 32, 0, stream>>>(src, blocks, block_len, round_len, row_len > 0 ? row_len : 1, dst);
}

// A warp per 128-value group of a row (grid-stride over the n rows' groups). kPack: wire row i is
// src row rows[i] quantised as above (a zero row, scales 1 and codes 0, where rows[i] < 0); else
// dst row i is wire row rows[i] read back (zeros where rows[i] < 0), with its bf16 twin where
// twin is not null.
template <bool kPack>
__global__ void wire_rows_fp8_kernel(const void* __restrict__ src, int64_t H, const int32_t* __restrict__ rows,
                                     int64_t n, void* __restrict__ dst, uint16_t* __restrict__ twin) {
  const int64_t groups = cpu::wire_fp8_groups(H), row_bytes = cpu::wire_fp8_row_bytes(H);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t u = first; u < n * groups; u += stride) {  // the same u for a whole warp
    const int64_t i = u / groups, g = u % groups, k0 = g * cpu::kWireFp8Group;
    const int64_t len = H - k0 < cpu::kWireFp8Group ? H - k0 : cpu::kWireFp8Group;
    const int32_t from = rows[i];
    if (kPack) {
      uint8_t* row = static_cast<uint8_t*>(dst) + i * row_bytes;
      uint8_t* codes = row + 4 * groups;
      float s = fp8_bits::act_scale(0.0f);
      if (from >= 0) {
        s = quantise_group_e4m3(static_cast<const float*>(src) + from * H + k0, len, codes + k0, lane);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (lane + 32 * j < len) codes[k0 + lane + 32 * j] = 0;
      }
      if (lane == 0) reinterpret_cast<float*>(row)[g] = s;
      if (g == groups - 1 && H + lane < row_bytes - 4 * groups) codes[H + lane] = 0;
    } else {
      float* x = static_cast<float*>(dst) + i * H + k0;
      const uint8_t* row = static_cast<const uint8_t*>(src) + (from < 0 ? 0 : from * row_bytes);
      const float s = from < 0 ? 0.0f : reinterpret_cast<const float*>(row)[g];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t k = lane + 32 * j;
        if (k >= len) continue;
        const float v = from < 0 ? 0.0f : fp8_bits::to_f32(row[4 * groups + k0 + k]) * s;
        x[k] = v;
        if (twin) twin[i * H + k0 + k] = bf16_bits::from_f32(v);
      }
    }
  }
}

template <bool kPack>
void launch_rows(const void* src, int64_t H, const int32_t* rows, int64_t n, void* dst, uint16_t* twin,
                 cudaStream_t stream) {
  if (H <= 0 || n <= 0) return;
  const int64_t x = (n * cpu::wire_fp8_groups(H) + kWarps - 1) / kWarps;
  wire_rows_fp8_kernel<kPack>
      <<<static_cast<unsigned>(x < 65535 * 16 ? x : 65535 * 16), kWarps * 32, 0, stream>>>(src, H, rows, n, dst, twin);
}

}  // namespace

void launch_pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst,
                          cudaStream_t stream) {
  launch_rows<true>(src, H, rows, n, dst, nullptr, stream);
}

void launch_unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst, uint16_t* twin,
                            cudaStream_t stream) {
  launch_rows<false>(src, H, rows, n, dst, twin, stream);
}

void launch_pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                     uint8_t* dst, cudaStream_t stream) {
  launch<true>(src, blocks, block_len, round_len, row_len, dst, stream);
}

void launch_unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                       float* dst, cudaStream_t stream) {
  launch<false>(src, blocks, block_len, round_len, row_len, dst, stream);
}

}  // namespace shardlm::cuda
