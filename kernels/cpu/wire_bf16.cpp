#include "cpu/wire_bf16.h"

#include <cstring>

#include "bf16_bits.h"

namespace shardlm::cpu {

namespace {

// Word j of block b sits at `at` on the wire: a rounded word as one 16-bit value, a whole one as
// two (low half first). kPack: words to the wire; else the wire back to words.
template <bool kPack>
void walk(const void* src, int64_t blocks, int64_t block_len, int64_t round_len, void* dst) {
  const int64_t wire = wire_bf16_len(block_len, round_len);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t j = 0; j < block_len; ++j) {
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
