// The bf16 KV cache of the CPU kernels (cpu/cache_rows.h): values are stored rounded to nearest
// even as torch's .to(bfloat16) rounds finite values, and attention over the cache is, bit for bit,
// attention over an fp32 cache holding the rounded values, for GQA (paged_attention) and MLA
// (latent_attention), with scrambled block tables, windows, widths with a tail past 16 values, and
// 1 or 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "bf16_bits.h"
#include "cpu/paged_attention.h"
#include "kernels/narrow_cache_batch.h"

using namespace shardlm;
using test::rand_vec;

namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST(Bf16Cache, RoundsToNearestEvenAsTorch) {
  struct Case {
    uint32_t in;
    uint16_t want;
  };
  // The finite and infinite cases are what torch's .to(torch.bfloat16) gives (checked with torch
  // 2 on this machine): ties go to the even mantissa, the largest finite floats round to
  // infinity. A NaN stays a NaN, quiet, with its sign and top payload bits (torch's own NaN
  // bits vary: 0x7fc0 from its scalar code, 0xffff from its vector code here).
  const Case cases[] = {
      {0x3f800000u, 0x3f80},  // 1
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: a tie, down to the even 1
      {0x3f818000u, 0x3f82},  // 1 + 3 * 2^-8: a tie, up to the even neighbour
      {0x3f808001u, 0x3f81},  // just above the tie: up
      {0x3f807fffu, 0x3f80},  // just below: down
      {0xbf818000u, 0xbf82},  // negative ties as positive
      {0x7f7fffffu, 0x7f80},  // FLT_MAX: past the largest bf16, infinity
      {0x7f800000u, 0x7f80},  // +inf
      {0xff800000u, 0xff80},  // -inf
      {0x7f800001u, 0x7fc0},  // a signalling NaN: quiet
      {0xffc00000u, 0xffc0},  // -NaN keeps its sign
      {0x00000001u, 0x0000},  // the smallest subnormal: down to +0
      {0x80000000u, 0x8000},  // -0
      {0x00018000u, 0x0002},  // a subnormal tie: up to even
  };
  for (const Case& c : cases) {
    EXPECT_EQ(bf16_bits::from_f32(bits_to_float(c.in)), c.want) << std::hex << "0x" << c.in;
  }
  // Widening is exact: every finite bf16 comes back as itself.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_bits::to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(bf16_bits::from_f32(f), h) << std::hex << h;
  }
}

TEST(Bf16Cache, KvCacheWriteStoresTheRoundedValues) {
  const int64_t n_kv = 2, hd = 24, T = 3, bs = 4;
  auto k = rand_vec(T * n_kv * hd, 1), v = rand_vec(T * n_kv * hd, 2);
  k[5] = NAN;
  v[7] = INFINITY;
  std::vector<uint16_t> kc(3 * bs * n_kv * hd, 0x1234), vc(kc.size(), 0x1234);
  const std::vector<int64_t> slots = {6, -1, 1};
  cpu::kv_cache_write(k.data(), v.data(), T, slots.data(), n_kv, hd, bs, kc.data(), vc.data(), cpu::CacheElem::BF16);
  size_t written = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < n_kv; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        const int64_t at = ((slots[t] / bs * n_kv + h) * bs + slots[t] % bs) * hd + d;
        ASSERT_EQ(kc[at], bf16_bits::from_f32(k[(t * n_kv + h) * hd + d]));
        ASSERT_EQ(vc[at], bf16_bits::from_f32(v[(t * n_kv + h) * hd + d]));
        ++written;
      }
  }
  size_t untouched = 0;
  for (size_t i = 0; i < kc.size(); ++i) untouched += kc[i] == 0x1234 && vc[i] == 0x1234;
  EXPECT_EQ(written + untouched, kc.size()) << "a slot outside slots[] was written";
}

TEST(Bf16Cache, PagedAttentionIsTheFp32CacheOfTheRoundedValues) {
  // Groups of 4 query heads read each row for more than one pair of queries (a round is widened
  // once); groups of 2 and 1 give a decode token one pair (rows widened as they are loaded).
  test::expect_paged_attention_reads_back<uint16_t>(KvElem::BF16, 0xffc0, {{64, 8, 2}, {72, 6, 3}, {8, 4, 4}});
}

TEST(Bf16Cache, LatentAttentionIsTheFp32CacheOfTheRoundedValues) {
  // 20 heads: items of many heads widen a round of rows once; 2 heads: a decode token's item
  // holds one pair of queries, which widen the rows as they load them.
  test::expect_latent_attention_reads_back<uint16_t>(KvElem::BF16, 0xffc0,
                                                     {{64, 16, 20}, {72, 8, 2}, {512, 64, 20}, {512, 64, 2}});
}
