#include "engine/logit_order.h"

#include <array>
#include <cstring>

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
  const size_t N = static_cast<size_t>(n);
  keys_.resize(N);
  keys_tmp_.resize(N);
  ids_tmp_.resize(N);
  order->resize(N);
  std::array<std::array<uint32_t, 256>, 4> count{};
  for (size_t i = 0; i < N; ++i) {
    const uint32_t k = descending_key(logits[i]);
    keys_[i] = k;
    (*order)[i] = static_cast<int32_t>(i);  // ascending ids: the stable passes keep ties in id order
    for (int d = 0; d < 4; ++d) ++count[d][(k >> (8 * d)) & 0xffu];
  }
  uint32_t* keys = keys_.data();
  uint32_t* keys_out = keys_tmp_.data();
  int32_t* ids = order->data();
  int32_t* ids_out = ids_tmp_.data();
  for (int d = 0; d < 4; ++d) {
    const int shift = 8 * d;
    // A digit every key shares moves nothing.
    if (N == 0 || count[d][(keys[0] >> shift) & 0xffu] == N) continue;
    std::array<uint32_t, 256> start{};
    uint32_t at = 0;
    for (int v = 0; v < 256; ++v) {
      start[v] = at;
      at += count[d][v];
    }
    for (size_t i = 0; i < N; ++i) {
      const uint32_t slot = start[(keys[i] >> shift) & 0xffu]++;
      keys_out[slot] = keys[i];
      ids_out[slot] = ids[i];
    }
    std::swap(keys, keys_out);
    std::swap(ids, ids_out);
  }
  if (ids != order->data()) std::memcpy(order->data(), ids, N * sizeof(int32_t));
}

}  // namespace shardlm
