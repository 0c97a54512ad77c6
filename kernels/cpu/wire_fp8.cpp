#include "cpu/wire_fp8.h"

#include <algorithm>
#include <cstring>

#include "cpu/attention_rows.h"
#include "cpu/fp8_narrow.h"
#include "cpu/threads.h"

namespace shardlm::cpu {

namespace {

// One row of row_len values quantised into its packed bytes (scales, codes, zero padding).
void pack_row(const float* x, int64_t row_len, int64_t groups, int64_t row_bytes, uint8_t* row) {
  uint8_t* codes = row + 4 * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * kWireFp8Group, n = std::min(row_len - k0, kWireFp8Group);
    const float s = detail::quantise_group_e4m3(x + k0, n, codes + k0);
    std::memcpy(row + 4 * g, &s, sizeof s);
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

// A zero row as pack_row writes it: scale act_scale(0) = 1 per group, zero codes and padding.
void zero_row(int64_t groups, int64_t row_bytes, uint8_t* row) {
  const float one = fp8_bits::act_scale(0.0f);
  for (int64_t g = 0; g < groups; ++g) std::memcpy(row + 4 * g, &one, sizeof one);
  std::fill(row + 4 * groups, row + row_bytes, uint8_t{0});
}

}  // namespace

void pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, uint8_t* dst) {
  walk<true>(src, blocks, block_len, round_len, row_len, dst);
}

void unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len, float* dst) {
  walk<false>(src, blocks, block_len, round_len, row_len, dst);
}

void pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst) {
  const int64_t groups = wire_fp8_groups(H), row_bytes = wire_fp8_row_bytes(H);
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n * H >= kParallelValues)
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* row = dst + i * row_bytes;
    if (rows[i] < 0) {
      zero_row(groups, row_bytes, row);
    } else {
      pack_row(src + static_cast<int64_t>(rows[i]) * H, H, groups, row_bytes, row);
    }
  }
}

void unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, float* dst) {
  const int64_t groups = wire_fp8_groups(H), row_bytes = wire_fp8_row_bytes(H);
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n * H >= kParallelValues)
  for (int64_t i = 0; i < n; ++i) {
    float* x = dst + i * H;
    if (rows[i] < 0) {
      std::fill(x, x + H, 0.0f);
    } else {
      unpack_row(src + static_cast<int64_t>(rows[i]) * row_bytes, H, groups, x);
    }
  }
}

}  // namespace shardlm::cpu
