#include "cuda/wire_bf16.h"

#include <cstdint>

#include "bf16_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

// A thread per source word (grid-stride): x over a block's words, y over the blocks. The rounded
// part writes one 16-bit value per word, the whole part two.
__global__ void pack_bf16_kernel(const float* __restrict__ src, int64_t blocks, int64_t block_len, int64_t round_len,
                                 uint16_t* __restrict__ dst) {
  const int64_t wire = 2 * block_len - round_len;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    const float* s = src + b * block_len;
    uint16_t* d = dst + b * wire;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < block_len;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      if (j < round_len) {
        d[j] = bf16_bits::from_f32(s[j]);
      } else {
        const uint32_t word = __float_as_uint(s[j]);
        const int64_t at = round_len + 2 * (j - round_len);
        d[at] = static_cast<uint16_t>(word & 0xffffu);
        d[at + 1] = static_cast<uint16_t>(word >> 16);
      }
    }
  }
}

__global__ void unpack_bf16_kernel(const uint16_t* __restrict__ src, int64_t blocks, int64_t block_len,
                                   int64_t round_len, float* __restrict__ dst) {
  const int64_t wire = 2 * block_len - round_len;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    const uint16_t* s = src + b * wire;
    float* d = dst + b * block_len;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < block_len;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      if (j < round_len) {
        d[j] = bf16_bits::to_f32(s[j]);
      } else {
        const int64_t at = round_len + 2 * (j - round_len);
        d[j] = __uint_as_float(static_cast<uint32_t>(s[at]) | (static_cast<uint32_t>(s[at + 1]) << 16));
      }
    }
  }
}

dim3 grid_for(int64_t blocks, int64_t block_len) {
  const int64_t x = (block_len + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(x < 1024 ? x : 1024), static_cast<unsigned>(blocks < kMaxGridY ? blocks : kMaxGridY));
}

}  // namespace

void launch_pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst,
                      cudaStream_t stream) {
  if (blocks <= 0 || block_len <= 0) return;
  pack_bf16_kernel<<<grid_for(blocks, block_len), kThreads, 0, stream>>>(src, blocks, block_len, round_len, dst);
}

void launch_unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst,
                        cudaStream_t stream) {
  if (blocks <= 0 || block_len <= 0) return;
  unpack_bf16_kernel<<<grid_for(blocks, block_len), kThreads, 0, stream>>>(src, blocks, block_len, round_len, dst);
}

}  // namespace shardlm::cuda
