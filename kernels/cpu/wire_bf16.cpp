#include "cpu/wire_bf16.h"

#include <algorithm>
#include <cstring>

#include "cpu/bf16_narrow.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

namespace {

// Rows are spread over the kernels' threads in chunks of this many words, past one chunk.
constexpr int64_t kChunk = 16384;

// Words [j0, j1) of a block: its rounded words as one 16-bit value each, then its whole ones as
// two (low half first, which is the little-endian word's byte order).
void pack_words(const float* x, int64_t j0, int64_t j1, int64_t round_len, uint16_t* d) {
  const int64_t r1 = std::min(j1, round_len);
  if (j0 < r1) detail::narrow_bf16(x + j0, r1 - j0, d + j0);
  const int64_t w0 = std::max(j0, round_len);
  if (w0 < j1) std::memcpy(d + round_len + 2 * (w0 - round_len), x + w0, static_cast<size_t>(j1 - w0) * 4);
}

void unpack_words(const uint16_t* s, int64_t j0, int64_t j1, int64_t round_len, float* x) {
  const int64_t r1 = std::min(j1, round_len);
  if (j0 < r1) detail::widen_bf16(s + j0, r1 - j0, x + j0);
  const int64_t w0 = std::max(j0, round_len);
  if (w0 < j1) std::memcpy(x + w0, s + round_len + 2 * (w0 - round_len), static_cast<size_t>(j1 - w0) * 4);
}

// kPack: words to the wire; else the wire back to words. The blocks' words go in chunks (a block
// may be one long run of rows), each on one of the kernels' threads.
template <bool kPack>
void walk(const void* src, int64_t blocks, int64_t block_len, int64_t round_len, void* dst) {
  const int64_t wire = wire_bf16_len(block_len, round_len);
  const int64_t chunks = (block_len + kChunk - 1) / kChunk, units = blocks * chunks;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (units > 1)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t b = u / chunks, j0 = u % chunks * kChunk, j1 = std::min(block_len, j0 + kChunk);
    if (kPack) {
      pack_words(static_cast<const float*>(src) + b * block_len, j0, j1, round_len,
                 static_cast<uint16_t*>(dst) + b * wire);
    } else {
      unpack_words(static_cast<const uint16_t*>(src) + b * wire, j0, j1, round_len,
                   static_cast<float*>(dst) + b * block_len);
    }
  }
}

}  // namespace

void pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) {
  walk<true>(src, blocks, block_len, round_len, dst);
}

void unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst) {
  walk<false>(src, blocks, block_len, round_len, dst);
}

void pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n * H >= kParallelValues)
  for (int64_t i = 0; i < n; ++i) {
    uint16_t* d = dst + i * H;
    if (rows[i] < 0) {
      std::fill(d, d + H, uint16_t{0});
    } else {
      detail::narrow_bf16(src + static_cast<int64_t>(rows[i]) * H, H, d);
    }
  }
}

void unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst) {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n * H >= kParallelValues)
  for (int64_t i = 0; i < n; ++i) {
    float* x = dst + i * H;
    if (rows[i] < 0) {
      std::fill(x, x + H, 0.0f);
    } else {
      detail::widen_bf16(src + static_cast<int64_t>(rows[i]) * H, H, x);
    }
  }
}

}  // namespace shardlm::cpu
