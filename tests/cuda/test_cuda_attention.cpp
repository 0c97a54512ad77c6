// The CUDA paged attention (GQA) and latent attention (MLA) kernels, and their cache writes,
// against the CPU kernels of kernels/cpu.
//
// Setup: several sequences of different lengths whose physical blocks are a shuffled permutation
// of the pool (so logical and physical order differ, and sequences interleave), cached entirely;
// one step of queries mixing decode tokens (T = 1 per sequence), prefill chunks and a padding
// token (pos -1, slot -1); and the same for a lone decode token (T = 1). Unused cache rows hold
// NaN, so a read outside a token's own attended positions shows up as a NaN in the result.
//
// One sequence is 1300 positions long, so its tokens span several position partitions
// (kernels/cuda/attention_partitions.h; a 37-position window across a partition boundary spans
// two): each attention call runs unsplit and split (as many blocks per token as the longest has
// partitions, and more), and the split outputs must equal the unsplit one bit for bit.
//
// Tolerances: the cache writes are exact. Attention outputs are softmax-weighted means of values in
// [-1, 1]; the GPU uses an online softmax and other dot-product orders, each score is off by about
// 1e-6 and the weights by as much relatively, so |gpu - cpu| <= 2e-5 + 1e-5 |cpu| over sequences of
// up to 1300 positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <tuple>
#include <vector>

#include "common/gpu.h"
#include "cuda/attention_cases.h"
#include "cpu/latent_attention.h"
#include "cpu/paged_attention.h"
#include "cuda/attention_partitions.h"
#include "cuda/compare.h"
#include "cuda/decode_latent_attention_mma.h"
#include "cuda/device_buffer.h"
#include "cuda/kv_cache_write.h"
#include "cuda/latent_attention.h"
#include "cuda/paged_attention.h"
#include "cuda/paged_attention_tiled.h"
#include "cuda/mma_bf16_tile.h"
#include "cuda/prefill_attention_mma.h"
#include "cuda/prefill_latent_attention_mma.h"
#include "bf16_bits.h"
#include "kv_cache_format.h"

using namespace shardlm;
using test::all_bits_equal;
using test::all_close;
using test::cuda_sync;
using test::DeviceBuffer;
using namespace shardlm::test;  // attention_cases.h

namespace {

Step decode_step(const Pool& pool) { return make_step(pool, {{4, 1299}}); }

// The most partitions any token of st has.
int64_t max_partitions(const Step& st, int64_t window) {
  int64_t n = 0;
  for (int32_t p : st.pos) n = std::max(n, cuda::attention_partitions(p, window));
  return n;
}

// Runs launch(split) unsplit and split with `parts` and parts + 2 blocks per token (at least 2; the
// extra ones find no partition); each into an output filled with NaN. Returns the unsplit output;
// the split ones must have its bits.
template <typename Launch>
std::vector<float> unsplit_and_split(size_t out_n, int64_t states_n_per_part, int64_t parts, Launch launch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer<float> d_out(std::vector<float>(out_n, nan));
  launch(cuda::AttentionSplit{}, d_out.get());
  cuda_sync("unsplit attention");
  const std::vector<float> unsplit = d_out.download();
  parts = std::max<int64_t>(parts, 2);
  for (int64_t p : {parts, parts + 2}) {
    SCOPED_TRACE(testing::Message() << "split into " << p);
    DeviceBuffer<float> d_split(std::vector<float>(out_n, nan));
    DeviceBuffer<float> d_states(std::vector<float>(static_cast<size_t>(states_n_per_part * p), nan));
    cuda::AttentionSplit split;
    split.parts = p;
    split.states = d_states.get();
    launch(split, d_split.get());
    cuda_sync("split attention");
    EXPECT_TRUE(all_bits_equal(d_split.download(), unsplit));
  }
  return unsplit;
}

struct GqaCase {
  int64_t n_heads, n_kv, head_dim, window;
};

}  // namespace

namespace {

// A cache of E: fp32 (float), bf16 (uint16_t, --kv-dtype bf16) or fp8 (uint8_t, --kv-dtype fp8,
// with K and V scales that are not powers of two). Unwritten rows hold NaN, so a stray read shows.
template <class E>
constexpr bool kNarrow = !std::is_same_v<E, float>;
template <class E>
E unwritten() {
  if constexpr (std::is_same_v<E, uint8_t>) {
    return 0x7f;
  } else if constexpr (std::is_same_v<E, uint16_t>) {
    return 0xffc0;
  } else {
    return std::numeric_limits<float>::quiet_NaN();
  }
}
template <class E>
KvFormat format_of() {
  if constexpr (std::is_same_v<E, uint8_t>) {
    return KvFormat(KvElem::FP8, 0.0123f, 0.0077f);
  } else if constexpr (std::is_same_v<E, uint16_t>) {
    return KvFormat(KvElem::BF16);
  } else {
    return KvFormat(KvElem::F32);
  }
}

// What a device cache [slots, row] of E must hold after rows [T, width] of x were written at
// offset `at` of their slots: the values, stored as the host stores them (kv_cache_format.h) with
// the side's scale.
template <class E>
void expect_rows(std::vector<E>& cache, const std::vector<float>& x, const std::vector<int64_t>& slots, int64_t width,
                 int64_t row, int64_t at, float scale) {
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    for (int64_t c = 0; c < width; ++c)
      kv_store(cache.data(), slots[t] * row + at + c, x[static_cast<int64_t>(t) * width + c], format_of<E>().elem,
               scale);
  }
}

// The same cache as fp32: a narrow cache's values read back (its NaN rows stay NaN).
template <class E>
std::vector<float> as_fp32(const std::vector<E>& cache, float scale) {
  std::vector<float> f(cache.size());
  for (size_t i = 0; i < cache.size(); ++i)
    f[i] = kv_load(cache.data(), static_cast<int64_t>(i), format_of<E>().elem, scale);
  return f;
}

// The pool every GQA case caches, with its block list and slots on the device.
struct DevicePool {
  Pool pool{16, kSeqLens, 5, 7};
  std::vector<int64_t> slots = pool.all_slots();
  int64_t n_write = static_cast<int64_t>(slots.size());
  DeviceBuffer<int32_t> d_blocks{pool.blocks};
  DeviceBuffer<int64_t> d_slots{slots};
};

// The tensor-core prefill kernel (prefill_attention_mma.h) over a step: within bf16's rounding of
// the CPU kernel's fp32 result (want), zero for the padding token; and the same bits whatever the
// tiles (the step's own: its chunks one query head a tile, its short runs a KV head's query heads
// a tile; every run cut every 5 tokens, one head a tile; every run's heads packed), as a token's
// result depends on its own query, position and cache alone.
//
// Tolerance: the query, an fp32 cache's keys and values, and the softmax weights are rounded to
// bf16 (8 significant bits). A score of magnitude up to about 1 is then off by up to ~2^-8 and
// each weight by ~2^-8 relatively, so an output (a weighted mean of values in [-1, 1]) is off by
// about 2^-8 at most: |gpu - cpu| <= 4e-3 + 1e-2 |cpu|.

// One variant of a tensor-core launch: the first (first empty) within the tolerance of want, each
// later one the first's bits.
void expect_mma_variant(const std::vector<float>& got, const std::vector<float>& want, std::vector<float>& first,
                        const std::string& what) {
  if (!first.empty()) {
    EXPECT_TRUE(all_bits_equal(got, first)) << what;
    return;
  }
  first = got;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  EXPECT_TRUE(all_close(got, want, kMmaRel, kMmaAbs)) << what << ", largest difference " << worst;
}

// Twin elements that are not their output's bf16 rounding; -1 if none (else the first's index).
int64_t first_wrong_twin(const std::vector<float>& out, const std::vector<uint16_t>& twin) {
  for (size_t i = 0; i < out.size(); ++i)
    if (twin[i] != bf16_bits::from_f32(out[i])) return static_cast<int64_t>(i);
  return -1;
}

template <class E>
void check_prefill_mma(const std::vector<float>& want, const std::vector<float>& q, const Step& st, const GqaCase& c,
                       KvFormat fmt, const std::vector<E>& k_rows, const std::vector<E>& v_rows,
                       const int32_t* d_blocks, int64_t block_size, float scale) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t T = static_cast<int64_t>(st.pos.size());
  DeviceBuffer<float> d_q(q);
  DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start);
  // The caches at the start of their buffers (16-byte aligned: staged 8 dims at a time where
  // head_dim allows) and one element further in (staged an element at a time).
  std::vector<E> k_off(1, E{}), v_off(1, E{});
  k_off.insert(k_off.end(), k_rows.begin(), k_rows.end());
  v_off.insert(v_off.end(), v_rows.begin(), v_rows.end());
  DeviceBuffer<E> d_kc(k_rows), d_vc(v_rows), d_koff(k_off), d_voff(v_off);
  const cuda::PrefillMmaTiles plan =
      cuda::prefill_attention_mma_tiles(st.table_start.data(), T, c.n_heads / c.n_kv, true);
  // Each run cut every `every` tokens, heads_per_tile query heads a tile.
  auto cut = [&](int32_t every, int heads_per_tile) {
    cuda::PrefillMmaTiles p;
    p.packed_heads = heads_per_tile;
    for (int64_t t = 0; t < T;) {
      int64_t run = 1;
      while (t + run < T && st.table_start[t + run] == st.table_start[t]) ++run;
      for (int64_t i = 0; i < run; i += every)
        p.tiles.insert(p.tiles.end(),
                       {static_cast<int32_t>(t + i), static_cast<int32_t>(std::min<int64_t>(every, run - i))});
      t += run;
    }
    (heads_per_tile == 1 ? p.one_head : p.packed) = static_cast<int64_t>(p.tiles.size() / 2);
    return p;
  };
  std::vector<float> first;
  for (const char* variant :
       {"the step's tiles", "runs of 5, one head a tile", "every run's heads packed", "unaligned caches"}) {
    cuda::PrefillMmaTiles tiles = plan;
    if (variant[0] == 'r') tiles = cut(5, 1);
    if (variant[0] == 'e') tiles = cut(cuda::kPrefillMmaRows / plan.packed_heads, plan.packed_heads);
    const bool off = variant[0] == 'u';
    DeviceBuffer<int32_t> d_tiles(tiles.tiles);
    DeviceBuffer<float> d_out(std::vector<float>(want.size(), nan));
    DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(want.size(), 0xdead));
    for (const auto& [n_tiles, heads, at] :
         {std::tuple<int64_t, int, int64_t>{tiles.one_head, 1, 0}, {tiles.packed, tiles.packed_heads, tiles.one_head}})
      cuda::prefill_attention_mma(d_q.get(), c.n_heads, c.n_kv, c.head_dim, off ? d_koff.get() + 1 : d_kc.get(),
                                  off ? d_voff.get() + 1 : d_vc.get(), fmt, block_size, d_blocks, d_start.get(),
                                  d_pos.get(), c.window, scale, d_tiles.get() + 2 * at, n_tiles, heads, d_out.get(),
                                  d_twin.get(), nullptr);
    cuda_sync("prefill_attention_mma");
    const std::vector<float> got = d_out.download();
    expect_mma_variant(got, want, first, std::string("tensor-core prefill, ") + variant);
    // Every token is in a tile: every element's twin is written with it.
    EXPECT_EQ(first_wrong_twin(got, d_twin.download()), -1) << "tensor-core prefill's twin, " << variant;
  }
  // The step's short runs (its decode tokens, seq 0's only token, the padding token, seq 1's
  // 15-token chunk where 15 x the group fits a tile) pack their KV head's query heads.
  const int64_t group = c.n_heads / c.n_kv;
  int expect_packed = 0;
  for (int d = 1; d <= cuda::kPrefillMmaRows && d <= group; ++d)
    if (group % d == 0) expect_packed = d;
  EXPECT_EQ(plan.packed_heads, expect_packed);
  EXPECT_EQ(plan.packed > 0, expect_packed > 1);
}

// One GQA case over a device cache of E: cuda::kv_cache_write stores exactly the expected rows;
// paged_attention, unsplit and split, matches the CPU kernel over a CPU cache of E within the
// tolerance; the tiled prefill launch gives its bits; and over bf16 or fp8, both give the bits of
// the same launches over an fp32 cache holding the values read back.
template <class E>
void check_paged_attention(const GqaCase& c, DevicePool& p) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Pool& pool = p.pool;
  const int64_t row = c.n_kv * c.head_dim;
  const int64_t cache_len = pool.num_blocks * pool.block_size * row;
  const std::vector<float> k = rand_vec(p.n_write * row, 101), v = rand_vec(p.n_write * row, 102);
  std::vector<E> k_cache(cache_len, unwritten<E>()), v_cache(cache_len, unwritten<E>());
  std::vector<E> k_rows(cache_len, unwritten<E>()), v_rows(cache_len, unwritten<E>());
  const KvFormat fmt = format_of<E>();
  cpu::kv_cache_write(k.data(), v.data(), p.n_write, p.slots.data(), c.n_kv, c.head_dim, pool.block_size,
                      k_cache.data(), v_cache.data(), fmt);
  expect_rows(k_rows, k, p.slots, row, row, 0, fmt.k_scale);
  expect_rows(v_rows, v, p.slots, row, row, 0, fmt.v_scale);

  DeviceBuffer<float> d_k(k), d_v(v);
  DeviceBuffer<E> d_kc(std::vector<E>(cache_len, unwritten<E>())), d_vc(std::vector<E>(cache_len, unwritten<E>()));
  cuda::kv_cache_write(d_k.get(), d_v.get(), p.n_write, p.d_slots.get(), c.n_kv, c.head_dim, d_kc.get(), d_vc.get(),
                       fmt, nullptr);
  cuda_sync("kv_cache_write");
  ASSERT_TRUE(all_bits_equal(d_kc.download(), k_rows));
  ASSERT_TRUE(all_bits_equal(d_vc.download(), v_rows));
  DeviceBuffer<float> d_k32(as_fp32(k_rows, fmt.k_scale)), d_v32(as_fp32(v_rows, fmt.v_scale));

  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (const Step& st : {mixed_step(pool), decode_step(pool)}) {
    const int64_t T = static_cast<int64_t>(st.pos.size());
    SCOPED_TRACE(testing::Message() << "T " << T);
    const std::vector<float> q = rand_vec(T * c.n_heads * c.head_dim, 103);
    const std::vector<const int32_t*> bt = host_block_table(pool, st);
    std::vector<float> want(T * c.n_heads * c.head_dim);
    cpu::paged_attention(q.data(), T, c.n_heads, c.n_kv, c.head_dim, k_cache.data(), v_cache.data(), fmt,
                         pool.block_size, bt.data(), st.pos.data(), c.window, scale, want.data());

    if (T > 1) {
      EXPECT_GE(max_partitions(st, c.window), 2) << "the mixed step should split";
    }
    DeviceBuffer<float> d_q(q);
    DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start);
    const std::vector<float> got =
        unsplit_and_split(want.size(), T * c.n_heads * (c.head_dim + 2), max_partitions(st, c.window),
                          [&](const cuda::AttentionSplit& split, float* out) {
                            cuda::paged_attention(d_q.get(), T, c.n_heads, c.n_kv, c.head_dim, d_kc.get(), d_vc.get(),
                                                  fmt, pool.block_size, p.d_blocks.get(), d_start.get(), d_pos.get(),
                                                  c.window, scale, out, nullptr, split, nullptr);
                          });
    EXPECT_TRUE(all_close(got, want, kRel, kAbs));
    // With a twin, unsplit and split: the same output, and beside it every element's bf16 rounding
    // (padding tokens' zeros, split tokens' rows from attention_combine included).
    for (int64_t parts : {int64_t{1}, std::max<int64_t>(max_partitions(st, c.window), 2)}) {
      SCOPED_TRACE(testing::Message() << "with a twin, parts " << parts);
      DeviceBuffer<float> d_out(std::vector<float>(want.size(), nan));
      DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(want.size(), 0xdead));
      DeviceBuffer<float> d_states(
          std::vector<float>(static_cast<size_t>(T * c.n_heads * (c.head_dim + 2) * parts), nan));
      cuda::AttentionSplit split;
      if (parts > 1) split = {parts, d_states.get()};
      cuda::paged_attention(d_q.get(), T, c.n_heads, c.n_kv, c.head_dim, d_kc.get(), d_vc.get(), fmt, pool.block_size,
                            p.d_blocks.get(), d_start.get(), d_pos.get(), c.window, scale, d_out.get(), d_twin.get(),
                            split, nullptr);
      cuda_sync("paged_attention with a twin");
      const std::vector<float> out = d_out.download();
      const std::vector<uint16_t> twin = d_twin.download();
      EXPECT_TRUE(all_bits_equal(out, got));
      EXPECT_EQ(first_wrong_twin(out, twin), -1) << "twin elements not their output's rounding";
    }
    if constexpr (kNarrow<E>) {
      DeviceBuffer<float> d_fp32(std::vector<float>(want.size(), nan));
      cuda::paged_attention(d_q.get(), T, c.n_heads, c.n_kv, c.head_dim, d_k32.get(), d_v32.get(), KvElem::F32,
                            pool.block_size, p.d_blocks.get(), d_start.get(), d_pos.get(), c.window, scale,
                            d_fp32.get(), nullptr, cuda::AttentionSplit{}, nullptr);
      cuda_sync("paged_attention over the values read back, in fp32");
      EXPECT_TRUE(all_bits_equal(got, d_fp32.download())) << "narrow cache against fp32 of its values";
    }
    // The prefill kernel that shares rounds across a sequence's tokens (tiles of 4, or 2 at
    // head_dim 256; see mixed_step for the runs): the per-token kernel's bits, without a twin and
    // with one (padding tokens' zeros included).
    for (const bool with_twin : {false, true}) {
      DeviceBuffer<float> d_tiled(std::vector<float>(want.size(), nan));
      DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(want.size(), 0xdead));
      cuda::paged_attention_tiled(d_q.get(), T, c.n_heads, c.n_kv, c.head_dim, d_kc.get(), d_vc.get(), fmt,
                                  pool.block_size, p.d_blocks.get(), d_start.get(), d_pos.get(), c.window, scale,
                                  d_tiled.get(), with_twin ? d_twin.get() : nullptr, nullptr);
      cuda_sync("paged_attention_tiled");
      EXPECT_TRUE(all_bits_equal(d_tiled.download(), got)) << "tiled, with a twin " << with_twin;
      if (with_twin) {
        EXPECT_EQ(first_wrong_twin(got, d_twin.download()), -1) << "tiled kernel's twin";
      }
    }
    check_prefill_mma(want, q, st, c, fmt, k_rows, v_rows, p.d_blocks.get(), pool.block_size, scale);
  }
}

// Random bf16 a [16, 16] and b [16, n] (row major, seeds from `seed`), c [16, n] in fp32, and
// c + a b in double rounded to fp32: the product a tensor-core tile test must give.
struct TileProduct {
  std::vector<uint16_t> a, b;
  std::vector<float> c, want;
};
TileProduct tile_product(int n, uint32_t seed) {
  TileProduct t;
  for (const float x : rand_vec(16 * 16, seed)) t.a.push_back(bf16_bits::from_f32(x));
  for (const float x : rand_vec(16 * n, seed + 1)) t.b.push_back(bf16_bits::from_f32(x));
  t.c = rand_vec(16 * n, seed + 2);
  t.want.resize(t.c.size());
  for (int r = 0; r < 16; ++r) {
    for (int j = 0; j < n; ++j) {
      double sum = t.c[r * n + j];
      for (int k = 0; k < 16; ++k)
        sum += double(bf16_bits::to_f32(t.a[r * 16 + k])) * bf16_bits::to_f32(t.b[k * n + j]);
      t.want[r * n + j] = static_cast<float>(sum);
    }
  }
  return t;
}

}  // namespace

// The tensor core product the prefill kernel builds on (kernels/cuda/mma_bf16.cuh), its fragments
// placed by the layout that header states: d = c + a b for random bf16 a [16, 16] and b [16, 8]
// must be the host's product (each bf16 product is exact in fp32; the 16-term sums agree to fp32
// rounding). A fragment element in the wrong place puts another product into its output.
TEST(CudaAttention, TensorCoreTileFollowsTheFragmentLayout) {
  SHARDLM_REQUIRE_GPU();
  const TileProduct t = tile_product(8, 501);
  DeviceBuffer<uint16_t> d_a(t.a), d_b(t.b);
  DeviceBuffer<float> d_c(t.c), d_d(std::vector<float>(t.want.size(), std::numeric_limits<float>::quiet_NaN()));
  cuda::mma_bf16_tile(d_a.get(), d_b.get(), d_c.get(), d_d.get(), nullptr);
  cuda_sync("mma_bf16_tile");
  EXPECT_TRUE(all_close(d_d.download(), t.want, 1e-6, 2e-6));
}

// The fragment loads of ldmatrix.cuh: a [16, 16] by ldmatrix_x4 and b [16, 16] row major by
// ldmatrix_x4_trans, from rows `pitch` elements apart, then two products: d = c + a b must be the
// host's, as above. A load that hands a lane another element puts another product there.
TEST(CudaAttention, LdmatrixLoadsTheFragmentLayout) {
  SHARDLM_REQUIRE_GPU();
  const TileProduct t = tile_product(16, 511);
  DeviceBuffer<uint16_t> d_a(t.a), d_b(t.b);
  DeviceBuffer<float> d_c(t.c);
  for (int pitch : {16, 24, 72}) {
    SCOPED_TRACE(testing::Message() << "pitch " << pitch);
    DeviceBuffer<float> d_d(std::vector<float>(t.want.size(), std::numeric_limits<float>::quiet_NaN()));
    cuda::mma_bf16_tile_ldmatrix(d_a.get(), d_b.get(), d_c.get(), d_d.get(), pitch, nullptr);
    cuda_sync("mma_bf16_tile_ldmatrix");
    EXPECT_TRUE(all_close(d_d.download(), t.want, 1e-6, 2e-6));
  }
}

TEST(CudaAttention, PagedAttentionMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  DevicePool p;
  // Query heads per KV head: 4, 1 (MHA), 12 (a block of 8 heads and one of 4 with idle warps),
  // 16 (two full blocks), 8 at head_dim 256 (the largest staged round). Windows: 37 (across a
  // partition boundary), 21, and 600 (the decode token's window starts inside a partition).
  // head_dim 20: not a multiple of 8 (the tensor-core kernel stages it an element at a time).
  for (const GqaCase& c : {GqaCase{8, 2, 64, 0}, GqaCase{8, 2, 128, 0}, GqaCase{8, 2, 128, 37}, GqaCase{4, 4, 96, 0},
                           GqaCase{32, 8, 128, 0}, GqaCase{24, 2, 64, 0}, GqaCase{16, 1, 128, 21},
                           GqaCase{8, 1, 256, 0}, GqaCase{8, 2, 128, 600}, GqaCase{6, 3, 20, 0}}) {
    SCOPED_TRACE(testing::Message() << "heads " << c.n_heads << "/" << c.n_kv << ", head_dim " << c.head_dim
                                    << ", window " << c.window);
    check_paged_attention<float>(c, p);
  }
}

// A bf16 cache (--kv-dtype bf16): the device stores the host's rounding (kernels/bf16_bits.h) bit
// for bit, and every launch over it gives the bits of the same launch over the rounded values in
// fp32, which the kernels only ever see. The decode kernel stages a bf16 or fp8 cache's rounds a
// round ahead in 8-element chunks and an fp32 one element by element (attention_util.cuh), so
// this holds the two ways to the same bits; head_dim 20 (no whole chunks) stages bf16 element by
// element. Heads of up to 64 dims run on the kernel's 64-dim build: 16 heads on 8 KV heads of 64
// (a 64-thread launch, both warps scoring), and 48 dims (lanes past the head's dims).
TEST(CudaAttention, PagedAttentionOverBf16CacheMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  DevicePool p;
  for (const GqaCase& c : {GqaCase{8, 2, 128, 0}, GqaCase{8, 1, 256, 37}, GqaCase{4, 4, 96, 0}, GqaCase{6, 3, 20, 0},
                           GqaCase{16, 8, 64, 0}, GqaCase{8, 2, 48, 37}}) {
    SCOPED_TRACE(testing::Message() << "bf16 cache, heads " << c.n_heads << "/" << c.n_kv << ", head_dim " << c.head_dim
                                    << ", window " << c.window);
    check_paged_attention<uint16_t>(c, p);
  }
}

// An fp8 cache (--kv-dtype fp8) with K and V scales: likewise, over the values read back.
TEST(CudaAttention, PagedAttentionOverFp8CacheMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  DevicePool p;
  for (const GqaCase& c :
       {GqaCase{8, 2, 128, 0}, GqaCase{8, 1, 256, 37}, GqaCase{4, 4, 96, 0}, GqaCase{16, 8, 64, 21}}) {
    SCOPED_TRACE(testing::Message() << "fp8 cache, heads " << c.n_heads << "/" << c.n_kv << ", head_dim " << c.head_dim
                                    << ", window " << c.window);
    check_paged_attention<uint8_t>(c, p);
  }
}

namespace {
struct MlaCase {
  int64_t n_heads, kv_lora, rope_dim, block_size;
};
}  // namespace

namespace {

// The tensor-core MLA prefill kernel (prefill_latent_attention_mma.h) over a step, as
// check_prefill_mma does for GQA: within the same bf16 tolerance of the CPU kernel's result, and
// the same bits when every token is a run of its own (other (token, head) pairs share its tiles)
// and when the cache is staged by elements rather than vectors.
template <class E>
void check_prefill_latent_mma(const std::vector<float>& want, const std::vector<float>& ql,
                              const std::vector<float>& qr, const Step& st, const MlaCase& c, KvFormat fmt,
                              const std::vector<E>& cache, const int32_t* d_blocks, int64_t block_size, float scale) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t T = static_cast<int64_t>(st.pos.size());
  DeviceBuffer<float> d_ql(ql), d_qr(qr);
  DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start);
  std::vector<E> shifted(1, E{});  // the cache one element into its buffer: staged by elements
  shifted.insert(shifted.end(), cache.begin(), cache.end());
  DeviceBuffer<E> d_cache(cache), d_shifted(shifted);
  std::vector<float> first;
  for (const char* variant : {"runs", "a run per token", "unaligned cache"}) {
    std::vector<int32_t> tiles;
    if (variant[0] == 'a') {  // a run per token: (token, 1 token, first pair) for each 16 of its heads
      for (int32_t t = 0; t < T; ++t)
        for (int32_t r = 0; r < c.n_heads; r += 16) tiles.insert(tiles.end(), {t, 1, r});
    } else {
      tiles = cuda::prefill_latent_attention_mma_tiles(st.table_start.data(), T, c.n_heads, true);
    }
    const E* dc = variant[0] == 'u' ? d_shifted.get() + 1 : d_cache.get();
    DeviceBuffer<int32_t> d_tiles(tiles);
    DeviceBuffer<float> d_out(std::vector<float>(want.size(), nan));
    cuda::prefill_latent_attention_mma(d_ql.get(), d_qr.get(), c.n_heads, c.kv_lora, c.rope_dim, dc, fmt, block_size,
                                       d_blocks, d_start.get(), d_pos.get(), scale, d_tiles.get(),
                                       static_cast<int64_t>(tiles.size() / 3), d_out.get(), nullptr);
    cuda_sync("prefill_latent_attention_mma");
    const std::vector<float> got = d_out.download();
    expect_mma_variant(got, want, first, std::string("tensor-core MLA prefill, ") + variant);
  }
}

// The tensor-core MLA decode kernel (decode_latent_attention_mma.h) over the same step, every token
// as a decode token of its own: within the bf16 tolerance of the CPU kernel's result, and the same
// bits split (as many blocks per token as the longest has partitions, and more) and unsplit, when
// the cache is staged by elements rather than vectors, and when each token is launched alone.
template <class E>
void check_decode_latent_mma(const std::vector<float>& want, const std::vector<float>& ql, const std::vector<float>& qr,
                             const Step& st, const MlaCase& c, KvFormat fmt, const std::vector<E>& cache,
                             const int32_t* d_blocks, int64_t block_size, float scale) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t T = static_cast<int64_t>(st.pos.size());
  DeviceBuffer<float> d_ql(ql), d_qr(qr);
  DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start);
  std::vector<E> shifted(1, E{});
  shifted.insert(shifted.end(), cache.begin(), cache.end());
  DeviceBuffer<E> d_cache(cache), d_shifted(shifted);
  // Tokens [t0, t0 + n) of the step from the cache at dc into out (the step's output).
  auto launch = [&](const E* dc, int64_t t0, int64_t n, const cuda::AttentionSplit& split, float* out) {
    cuda::decode_latent_attention_mma(d_ql.get() + t0 * c.n_heads * c.kv_lora, d_qr.get() + t0 * c.n_heads * c.rope_dim,
                                      n, c.n_heads, c.kv_lora, c.rope_dim, dc, fmt, block_size, d_blocks,
                                      d_start.get() + t0, d_pos.get() + t0, scale, out + t0 * c.n_heads * c.kv_lora,
                                      split, nullptr);
  };
  std::vector<float> first;
  const std::vector<float> step = unsplit_and_split(
      want.size(), T * c.n_heads * (c.kv_lora + 2), max_partitions(st, 0),
      [&](const cuda::AttentionSplit& split, float* out) { launch(d_cache.get(), 0, T, split, out); });
  expect_mma_variant(step, want, first, "tensor-core MLA decode");
  for (const char* variant : {"unaligned cache", "a token a launch"}) {
    DeviceBuffer<float> d_out(std::vector<float>(want.size(), nan));
    if (variant[0] == 'u') {
      launch(d_shifted.get() + 1, 0, T, cuda::AttentionSplit{}, d_out.get());
    } else {
      for (int64_t t = 0; t < T; ++t) launch(d_cache.get(), t, 1, cuda::AttentionSplit{}, d_out.get());
    }
    cuda_sync("decode_latent_attention_mma");
    expect_mma_variant(d_out.download(), want, first, std::string("tensor-core MLA decode, ") + variant);
  }
}

// One MLA case over a device latent cache of E, as check_paged_attention does for GQA (the CPU and
// the device keep the same latent rows, so the device cache must equal the CPU's bit for bit).
template <class E>
void check_latent_attention(const MlaCase& c) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Pool pool(c.block_size, kSeqLens, 3, 9);
  const std::vector<int64_t> slots = pool.all_slots();
  const int64_t n_write = static_cast<int64_t>(slots.size());
  const int64_t row = c.kv_lora + c.rope_dim;
  const int64_t cache_len = pool.num_blocks * pool.block_size * row;
  const std::vector<float> lat = rand_vec(n_write * c.kv_lora, 201), kr = rand_vec(n_write * c.rope_dim, 202);
  std::vector<E> cache(cache_len, unwritten<E>()), rows(cache_len, unwritten<E>());
  const KvFormat fmt = format_of<E>();  // the latent row takes the K side's scale
  cpu::latent_cache_write(lat.data(), kr.data(), n_write, slots.data(), c.kv_lora, c.rope_dim, cache.data(), fmt);
  expect_rows(rows, lat, slots, c.kv_lora, row, 0, fmt.k_scale);
  expect_rows(rows, kr, slots, c.rope_dim, row, c.kv_lora, fmt.k_scale);
  ASSERT_TRUE(all_bits_equal(cache, rows)) << "the CPU's latent rows";

  DeviceBuffer<float> d_lat(lat), d_kr(kr);
  DeviceBuffer<E> d_cache(std::vector<E>(cache_len, unwritten<E>()));
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<int32_t> d_blocks(pool.blocks);
  cuda::latent_cache_write(d_lat.get(), d_kr.get(), n_write, d_slots.get(), c.kv_lora, c.rope_dim, d_cache.get(), fmt,
                           nullptr);
  cuda_sync("latent_cache_write");
  ASSERT_TRUE(all_bits_equal(d_cache.download(), cache));
  DeviceBuffer<float> d_cache32(as_fp32(cache, fmt.k_scale));

  // DeepSeek's softmax scale: 1 / sqrt(qk_nope + qk_rope) = 1 / sqrt(192).
  const float scale = 1.0f / std::sqrt(192.0f);
  for (const Step& st : {mixed_step(pool), decode_step(pool)}) {
    const int64_t T = static_cast<int64_t>(st.pos.size());
    SCOPED_TRACE(testing::Message() << "T " << T);
    const std::vector<float> ql = rand_vec(T * c.n_heads * c.kv_lora, 203);
    const std::vector<float> qr = rand_vec(T * c.n_heads * c.rope_dim, 204);
    const std::vector<const int32_t*> bt = host_block_table(pool, st);
    std::vector<float> want(T * c.n_heads * c.kv_lora);
    cpu::latent_attention(ql.data(), qr.data(), T, c.n_heads, c.kv_lora, c.rope_dim, cache.data(), fmt, pool.block_size,
                          bt.data(), st.pos.data(), scale, want.data());

    if (T > 1) {
      EXPECT_GE(max_partitions(st, 0), 2) << "the mixed step should split";
    }
    DeviceBuffer<float> d_ql(ql), d_qr(qr);
    DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start);
    const std::vector<float> got =
        unsplit_and_split(want.size(), T * c.n_heads * (c.kv_lora + 2), max_partitions(st, 0),
                          [&](const cuda::AttentionSplit& split, float* out) {
                            cuda::latent_attention(d_ql.get(), d_qr.get(), T, c.n_heads, c.kv_lora, c.rope_dim,
                                                   d_cache.get(), fmt, pool.block_size, d_blocks.get(), d_start.get(),
                                                   d_pos.get(), scale, out, split, nullptr);
                          });
    EXPECT_TRUE(all_close(got, want, kRel, kAbs));
    if constexpr (kNarrow<E>) {
      DeviceBuffer<float> d_fp32(std::vector<float>(want.size(), nan));
      cuda::latent_attention(d_ql.get(), d_qr.get(), T, c.n_heads, c.kv_lora, c.rope_dim, d_cache32.get(), KvElem::F32,
                             pool.block_size, d_blocks.get(), d_start.get(), d_pos.get(), scale, d_fp32.get(),
                             cuda::AttentionSplit{}, nullptr);
      cuda_sync("latent_attention over the values read back, in fp32");
      EXPECT_TRUE(all_bits_equal(got, d_fp32.download())) << "narrow cache against fp32 of its values";
    }
    check_prefill_latent_mma(want, ql, qr, st, c, fmt, cache, d_blocks.get(), pool.block_size, scale);
    check_decode_latent_mma(want, ql, qr, st, c, fmt, cache, d_blocks.get(), pool.block_size, scale);
  }
}

}  // namespace

TEST(CudaAttention, LatentAttentionMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  // DeepSeek-V3 / Kimi K2 shapes (a tensor-parallel shard of 16 heads), and odd sizes.
  // Heads per block: 8 (two full blocks), 3 (one partial block), 20 (8 + 8 + 4 with idle warps), 1.
  // kv_lora 36, rope 12: not multiples of 8 (the tensor-core kernel stages them an element at a time).
  // kv_lora 32, rope 16: an odd count of 16-dim score steps (the tensor-core kernels load their key
  // fragments two steps at a time); kv_lora 80 and 96: an odd count of value tiles a warp.
  for (const MlaCase& c :
       {MlaCase{16, 512, 64, 64}, MlaCase{16, 512, 64, 16}, MlaCase{3, 80, 16, 16}, MlaCase{20, 512, 64, 16},
        MlaCase{1, 96, 32, 16}, MlaCase{2, 36, 12, 16}, MlaCase{4, 32, 16, 16}}) {
    SCOPED_TRACE(testing::Message() << "heads " << c.n_heads << ", kv_lora " << c.kv_lora << ", rope " << c.rope_dim
                                    << ", block " << c.block_size);
    check_latent_attention<float>(c);
  }
}

TEST(CudaAttention, LatentAttentionOverBf16CacheMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  for (const MlaCase& c : {MlaCase{16, 512, 64, 16}, MlaCase{3, 80, 16, 16}}) {
    SCOPED_TRACE(testing::Message() << "bf16 cache, heads " << c.n_heads << ", kv_lora " << c.kv_lora << ", rope "
                                    << c.rope_dim);
    check_latent_attention<uint16_t>(c);
  }
}

TEST(CudaAttention, LatentAttentionOverFp8CacheMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  for (const MlaCase& c : {MlaCase{16, 512, 64, 16}, MlaCase{3, 80, 16, 16}}) {
    SCOPED_TRACE(testing::Message() << "fp8 cache, heads " << c.n_heads << ", kv_lora " << c.kv_lora << ", rope "
                                    << c.rope_dim);
    check_latent_attention<uint8_t>(c);
  }
}
