#include "engine/logit_order.h"

#include <array>
#include <cstring>
#include <utility>

namespace shardlm {

uint32_t descending_key(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  if (b == 0x80000000u) b = 0;  // -0.0 == +0.0
  // Negative floats order reversed by their bits, non-negative ones directly: flipping all bits of
  // a negative and the sign bit of a non-negative gives an ascending unsigned key; its complement
  // is descending.
  const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ~ascending;
}

void LogitOrder::sort(const float* logits, int64_t n, std::vector<int32_t>* order) {
  // Each item packs its key over its id, so a pass moves one 8-byte word instead of a key and an
  // id, in three passes of 11, 11 and 10 bits instead of four of 8 (the counts, 24 KiB, stay in
  // L1): 32000 logits sort in 140 us instead of 210 here. Past the L2 (152k logits) it is no faster.
  constexpr int kPasses = 3, kDigitBits = 11;
  constexpr uint32_t kMask = (1u << kDigitBits) - 1;
  const size_t N = static_cast<size_t>(n);
  items_.resize(N);
  items_tmp_.resize(N);
  order->resize(N);
  std::array<std::array<uint32_t, kMask + 1>, kPasses> count{};
  for (size_t i = 0; i < N; ++i) {
    const uint32_t k = descending_key(logits[i]);
    // Ids ascending: the stable passes keep ties in id order.
    items_[i] = (static_cast<uint64_t>(k) << 32) | static_cast<uint32_t>(i);
    for (int d = 0; d < kPasses; ++d) ++count[d][(k >> (kDigitBits * d)) & kMask];
  }
  uint64_t* items = items_.data();
  uint64_t* out = items_tmp_.data();
  for (int d = 0; d < kPasses; ++d) {
    const int shift = 32 + kDigitBits * d;
    // A digit every key shares moves nothing.
    if (N == 0 || count[d][(items[0] >> shift) & kMask] == N) continue;
    std::array<uint32_t, kMask + 1> start;
    uint32_t at = 0;
    for (uint32_t v = 0; v <= kMask; ++v) {
      start[v] = at;
      at += count[d][v];
    }
    for (size_t i = 0; i < N; ++i) out[start[(items[i] >> shift) & kMask]++] = items[i];
    std::swap(items, out);
  }
  for (size_t i = 0; i < N; ++i) (*order)[i] = static_cast<int32_t>(items[i] & 0xffffffffu);
}

}  // namespace shardlm
