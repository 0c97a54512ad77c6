#include "cuda/wire_bf16.h"

#include <cstdint>

#include "bf16_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

// A thread per word of a block (grid-stride): x over a block's words, y over the blocks. Word j
// sits at `at` on the wire: a rounded word as one 16-bit value, a whole one as two (low half
// first). kPack: words to the wire; else the wire back to words.
template <bool kPack>
__global__ void wire_bf16_kernel(const void* __restrict__ src, int64_t blocks, int64_t block_len, int64_t round_len,
                                 void* __restrict__ dst) {
  const int64_t wire = 2 * block_len - round_len;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < block_len;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const bool rounded = j < round_len;
      const int64_t at = rounded ? j : round_len + 2 * (j - round_len);
      if (kPack) {
        const float x = static_cast<const float*>(src)[b * block_len + j];
        uint16_t* d = static_cast<uint16_t*>(dst) + b * wire + at;
        if (rounded) {
          d[0] = bf16_bits::from_f32(x);
        } else {
          const uint32_t word = __float_as_uint(x);
          d[0] = static_cast<uint16_t>(word & 0xffffu);
          d[1] = static_cast<uint16_t>(word >> 16);
        }
      } else {
        const uint16_t* s = static_cast<const uint16_t*>(src) + b * wire + at;
        static_cast<float*>(dst)[b * block_len + j] =
            rounded ? bf16_bits::to_f32(s[0])
                    : __uint_as_float(static_cast<uint32_t>(s[0]) | (static_cast<uint32_t>(s[1]) << 16));
      }
    }
  }
}

template <bool kPack>
void launch(const void* src, int64_t blocks, int64_t block_len, int64_t round_len, void* dst, cudaStream_t stream) {
  if (blocks <= 0 || block_len <= 0) return;
  const int64_t x = (block_len + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(x < 1024 ? x : 1024),
                  static_cast<unsigned>(blocks < kMaxGridY ? blocks : kMaxGridY));
  wire_bf16_kernel<kPack><<<grid, kThreads, 0, stream>>>(src, blocks, block_len, round_len, dst);
}

// A block per row (grid-stride over rows), its threads over the row's H values. kPack: dst row i
// is src row rows[i] rounded; else dst row i is wire row rows[i] widened, and where twin is not
// null its twin row the widened value rounded back (the wire's bits: widening is exact). Zeros
// where rows[i] < 0.
template <bool kPack>
__global__ void wire_rows_bf16_kernel(const void* __restrict__ src, int64_t H, const int32_t* __restrict__ rows,
                                      int64_t n, void* __restrict__ dst, uint16_t* __restrict__ twin) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t from = rows[i];
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      if (kPack) {
        static_cast<uint16_t*>(dst)[i * H + c] =
            from < 0 ? uint16_t{0} : bf16_bits::from_f32(static_cast<const float*>(src)[from * H + c]);
      } else {
        const float v = from < 0 ? 0.0f : bf16_bits::to_f32(static_cast<const uint16_t*>(src)[from * H + c]);
        static_cast<float*>(dst)[i * H + c] = v;
        if (twin) twin[i * H + c] = bf16_bits::from_f32(v);
      }
    }
  }
}

template <bool kPack>
void launch_rows(const void* src, int64_t H, const int32_t* rows, int64_t n, void* dst, uint16_t* twin,
                 cudaStream_t stream) {
  if (H <= 0 || n <= 0) return;
  wire_rows_bf16_kernel<kPack>
      <<<static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16), kThreads, 0, stream>>>(src, H, rows, n, dst, twin);
}

}  // namespace

void launch_pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst,
                           cudaStream_t stream) {
  launch_rows<true>(src, H, rows, n, dst, nullptr, stream);
}

void launch_unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst, uint16_t* twin,
                             cudaStream_t stream) {
  launch_rows<false>(src, H, rows, n, dst, twin, stream);
}

void launch_pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst,
                      cudaStream_t stream) {
  launch<true>(src, blocks, block_len, round_len, dst, stream);
}

void launch_unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst,
                        cudaStream_t stream) {
  launch<false>(src, blocks, block_len, round_len, dst, stream);
}

}  // namespace shardlm::cuda
