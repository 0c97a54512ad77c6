// The fp8 (e4m3fn) KV cache of the CPU kernels (kernels/kv_cache_format.h): a value is stored as
// the code of value / scale, rounded to nearest even and saturated, and read back as code * scale;
// attention over the cache is, bit for bit, attention over an fp32 cache holding the values read
// back, for GQA (paged_attention) and MLA (latent_attention), with scales that are not powers of
// two, scrambled block tables, windows, widths with a tail past 16 values, and 1 or 2 threads.
// (fp8_torch_check.py checks the conversion itself against torch, bit for bit.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/attention_rows.h"
#include "cpu/paged_attention.h"
#include "fp8_bits.h"
#include "kernels/narrow_cache_batch.h"
#include "kv_cache_format.h"
#include "common/float_bits.h"

using namespace shardlm;
using test::rand_vec;

namespace {

using test::bits;

constexpr uint8_t kUnwritten = 0x7f;  // NaN: an unwritten row shows in the results

}  // namespace

// The kernels' vector read-back (16 codes at a time) gives the scalar rule's bits for every code
// under every scale, NaN codes as NaN: the portable integer form, the F16C and AVX-512 forms where
// the target has them, and the row walk with its tail.
TEST(Fp8Cache, VectorReadBackIsTheScalarRule) {
  using cpu::detail::v16f;
  uint8_t codes[256];
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  std::vector<std::pair<const char*, v16f (*)(const uint8_t*, float)>> forms{
      {"portable", cpu::detail::fp8_impl::widen_portable}, {"widen16", cpu::detail::widen16}};
#if defined(__F16C__)
  forms.push_back({"f16c", cpu::detail::fp8_impl::widen_f16c});
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  forms.push_back({"avx512", cpu::detail::fp8_impl::widen_avx512});
#endif
  for (float scale : {1.0f, 0.0371f, 3.3f, 1.0f / 448.0f, 1e-30f}) {
    for (const auto& [name, widen] : forms) {
      for (int c0 = 0; c0 < 256; c0 += 16) {
        const v16f v = widen(codes + c0, scale);
        for (int l = 0; l < 16; ++l) {
          const float want = kv_load(codes, c0 + l, KvElem::FP8, scale);
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(v[l])) << name << ", code " << c0 + l;
          } else {
            EXPECT_EQ(bits(v[l]), bits(want)) << name << ", code " << c0 + l << ", scale " << scale;
          }
        }
      }
    }
    std::vector<float> row(77);
    cpu::detail::widen_row(codes + 100, 77, scale, row.data());  // 4 vectors and a tail
    for (int i = 0; i < 77; ++i) {
      const float want = kv_load(codes, 100 + i, KvElem::FP8, scale);
      ASSERT_EQ(std::isnan(row[i]), std::isnan(want)) << "code " << int{codes[100 + i]} << ", element " << i;
      if (!std::isnan(want)) {
        EXPECT_EQ(bits(row[i]), bits(want)) << i;
      }
    }
  }
}

TEST(Fp8Cache, KvCacheWriteStoresTheScaledCodes) {
  const int64_t n_kv = 2, hd = 24, T = 3, bs = 4;
  auto k = rand_vec(T * n_kv * hd, 1, 40.0f), v = rand_vec(T * n_kv * hd, 2);
  k[5] = NAN;
  k[6] = 1e6f;  // saturates to the largest code
  v[7] = -INFINITY;
  const float ks = 0.13f, vs = 0.0029f;
  std::vector<uint8_t> kc(3 * bs * n_kv * hd, 0x11), vc(kc.size(), 0x11);
  const std::vector<int64_t> slots = {6, -1, 1};
  cpu::kv_cache_write(k.data(), v.data(), T, slots.data(), n_kv, hd, bs, kc.data(), vc.data(),
                      KvFormat(KvElem::FP8, ks, vs));
  size_t written = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < n_kv; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        const int64_t at = ((slots[t] / bs * n_kv + h) * bs + slots[t] % bs) * hd + d;
        ASSERT_EQ(kc[at], fp8_bits::from_f32(k[(t * n_kv + h) * hd + d] / ks));
        ASSERT_EQ(vc[at], fp8_bits::from_f32(v[(t * n_kv + h) * hd + d] / vs));
        ++written;
      }
  }
  EXPECT_EQ(kc[((6 / bs * n_kv) * bs + 6 % bs) * hd + 5] & 0x7f, 0x7f) << "NaN stays NaN";
  EXPECT_EQ(kc[((6 / bs * n_kv) * bs + 6 % bs) * hd + 6], 0x7e) << "1e6 saturates to 448";
  EXPECT_EQ(vc[((6 / bs * n_kv) * bs + 6 % bs) * hd + 7], 0xfe) << "-inf saturates to -448";
  size_t untouched = 0;
  for (size_t i = 0; i < kc.size(); ++i) untouched += kc[i] == 0x11 && vc[i] == 0x11;
  EXPECT_EQ(written + untouched, kc.size()) << "a slot outside slots[] was written";
}

TEST(Fp8Cache, PagedAttentionIsTheFp32CacheOfTheReadBackValues) {
  // Groups of 4, 2 and 1 query heads: every shape of tile the bf16 cache distinguishes.
  for (const KvFormat& fmt : {KvFormat(KvElem::FP8), KvFormat(KvElem::FP8, 0.0173f, 0.0041f)}) {
    test::expect_paged_attention_reads_back<uint8_t>(fmt, kUnwritten, {{64, 8, 2}, {72, 6, 3}, {8, 4, 4}});
  }
}

TEST(Fp8Cache, LatentAttentionIsTheFp32CacheOfTheReadBackValues) {
  // The V scale (123) must play no part: the latent row is one K-side row.
  for (const KvFormat& fmt : {KvFormat(KvElem::FP8), KvFormat(KvElem::FP8, 0.0093f, 123.0f)}) {
    test::expect_latent_attention_reads_back<uint8_t>(fmt, kUnwritten,
                                                      {{64, 16, 20}, {72, 8, 2}, {512, 64, 20}, {512, 64, 2}});
  }
}
