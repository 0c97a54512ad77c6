#include "cpu/wire_fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/attention_rows.h"
#include "cpu/fp8_narrow.h"
#include "cpu/threads.h"
#include "fp8_bits.h"

namespace shardlm::cpu {

namespace {

using detail::load16;
using detail::v16f;
using detail::v16u;

// Rows are spread over the kernels' threads past this many values (below it, one thread is faster).
constexpr int64_t kParallelValues = 32768;

// The largest magnitude of x[0..n), NaNs skipped (fp8_bits::nan_skipping_max), 0 for none.
float group_amax(const float* x, int64_t n) {
  v16f m{};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    v16u u;
    const v16f v = load16(x + k);
    std::memcpy(&u, &v, sizeof u);
    u &= 0x7fffffffu;
    v16f a;
    std::memcpy(&a, &u, sizeof a);
    m = detail::select16(a > m, a, m);  // false for NaN
  }
  float amax = 0.0f;
  for (int l = 0; l < 16; ++l) amax = fp8_bits::nan_skipping_max(amax, m[l]);
  for (; k < n; ++k) amax = fp8_bits::nan_skipping_max(amax, std::fabs(x[k]));
  return amax;
}

// codes[k] = from_f32(x[k] / s), k < n.
void quantise(const float* x, int64_t n, float s, uint8_t* codes) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const detail::v16b q = detail::narrow16_e4m3(load16(x + k) / s);
    std::memcpy(codes + k, &q, sizeof q);
  }
  for (; k < n; ++k) codes[k] = fp8_bits::from_f32(x[k] / s);
}

// One row of row_len values quantised into its packed bytes (scales, codes, zero padding).
void pack_row(const float* x, int64_t row_len, int64_t groups, int64_t row_bytes, uint8_t* row) {
  uint8_t* codes = row + 4 * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * kWireFp8Group, n = std::min(row_len - k0, kWireFp8Group);
    const float s = fp8_bits::act_scale(group_amax(x + k0, n));
    std::memcpy(row + 4 * g, &s, sizeof s);
    quantise(x + k0, n, s, codes + k0);
  }
  std::fill(codes + row_len, row + row_bytes, uint8_t{0});
}

void unpack_row(const uint8_t* row, int64_t row_len, int64_t groups, float* x) {
  for (int64_t g = 0; g < groups; ++g) {
    float s;
    std::memcpy(&s, row + 4 * g, sizeof s);
    const int64_t k0 = g * kWireFp8Group;
    detail::widen_row(row + 4 * groups + k0, std::min(row_len - k0, kWireFp8Group), s, x + k0);
  }
}

// Every row of every block (spread over the kernels' threads), then each block's whole words.
// kPack: the blocks' words to the wire; else the wire back to words.
template <bool kPack>
void walk(const void* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, void* dst) {
  const int64_t rows = round_len / row_len, groups = wire_fp8_groups(row_len);
  const int64_t row_bytes = wire_fp8_row_bytes(row_len), wire = wire_fp8_bytes(block_len, round_len, row_len);
  float* words = static_cast<float*>(kPack ? const_cast<void*>(src) : dst);
  uint8_t* packed = static_cast<uint8_t*>(kPack ? dst : const_cast<void*>(src));
  const int64_t units = blocks * rows;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (units * row_len >= kParallelValues)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t b = u / rows, r = u % rows;
    float* x = words + b * block_len + r * row_len;
    uint8_t* row = packed + b * wire + r * row_bytes;
    if (kPack) {
      pack_row(x, row_len, groups, row_bytes, row);
    } else {
      unpack_row(row, row_len, groups, x);
    }
  }
  const auto whole = static_cast<size_t>(block_len - round_len) * 4;
  for (int64_t b = 0; b < blocks; ++b) {
    float* w = words + b * block_len + round_len;
    uint8_t* p = packed + b * wire + rows * row_bytes;
    if (kPack) {
      std::memcpy(p, w, whole);
    } else {
      std::memcpy(w, p, whole);
    }
  }
}

}  // namespace

void pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, uint8_t* dst) {
  walk<true>(src, blocks, block_len, round_len, row_len, dst);
}

void unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, float* dst) {
  walk<false>(src, blocks, block_len, round_len, row_len, dst);
}

}  // namespace shardlm::cpu
