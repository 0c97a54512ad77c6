#include "cpu/wire_bf16.h"

#include <cstring>

#include "bf16_bits.h"

namespace shardlm::cpu {

void pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) {
  const int64_t wire = wire_bf16_len(block_len, round_len);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* s = src + b * block_len;
    uint16_t* d = dst + b * wire;
    for (int64_t j = 0; j < round_len; ++j) d[j] = bf16_bits::from_f32(s[j]);
    for (int64_t j = round_len; j < block_len; ++j) {
      uint32_t word;
      std::memcpy(&word, s + j, sizeof word);
      d[round_len + 2 * (j - round_len)] = static_cast<uint16_t>(word & 0xffffu);
      d[round_len + 2 * (j - round_len) + 1] = static_cast<uint16_t>(word >> 16);
    }
  }
}

void unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst) {
  const int64_t wire = wire_bf16_len(block_len, round_len);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* s = src + b * wire;
    float* d = dst + b * block_len;
    for (int64_t j = 0; j < round_len; ++j) d[j] = bf16_bits::to_f32(s[j]);
    for (int64_t j = round_len; j < block_len; ++j) {
      const uint32_t word = static_cast<uint32_t>(s[round_len + 2 * (j - round_len)]) |
                            (static_cast<uint32_t>(s[round_len + 2 * (j - round_len) + 1]) << 16);
      std::memcpy(d + j, &word, sizeof word);
    }
  }
}

}  // namespace shardlm::cpu
