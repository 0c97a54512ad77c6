#include "cpu/wire_bf16.h"

#include <algorithm>
#include <cstring>

#include "bf16_bits.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

namespace {

// Rows are spread over the kernels' threads in chunks of this many words, past one chunk.
constexpr int64_t kChunk = 16384;

// Word j of block b sits at `at` on the wire: a rounded word as one 16-bit value, a whole one as
// two (low half first). kPack: words to the wire; else the wire back to words. The blocks' words
// go in chunks (a block may be one long run of rows), each on one of the kernels' threads.
template <bool kPack>
void walk(const void* src, int64_t blocks, int64_t block_len, int64_t round_len, void* dst) {
  const int64_t wire = wire_bf16_len(block_len, round_len);
  const int64_t chunks = (block_len + kChunk - 1) / kChunk, units = blocks * chunks;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (units > 1)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t b = u / chunks, j0 = u % chunks * kChunk, j1 = std::min(block_len, j0 + kChunk);
    for (int64_t j = j0; j < j1; ++j) {
      const bool rounded = j < round_len;
      const int64_t at = rounded ? j : round_len + 2 * (j - round_len);
      if (kPack) {
        const float* x = static_cast<const float*>(src) + b * block_len + j;
        uint16_t* d = static_cast<uint16_t*>(dst) + b * wire + at;
        if (rounded) {
          d[0] = bf16_bits::from_f32(*x);
        } else {
          uint32_t word;
          std::memcpy(&word, x, sizeof word);
          d[0] = static_cast<uint16_t>(word & 0xffffu);
          d[1] = static_cast<uint16_t>(word >> 16);
        }
      } else {
        const uint16_t* s = static_cast<const uint16_t*>(src) + b * wire + at;
        float* x = static_cast<float*>(dst) + b * block_len + j;
        if (rounded) {
          *x = bf16_bits::to_f32(s[0]);
        } else {
          const uint32_t word = static_cast<uint32_t>(s[0]) | (static_cast<uint32_t>(s[1]) << 16);
          std::memcpy(x, &word, sizeof word);
        }
      }
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

}  // namespace shardlm::cpu
