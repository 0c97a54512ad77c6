// The CUDA paged attention (GQA) and latent attention (MLA) kernels, and their cache writes,
// against the CPU kernels of kernels/cpu.
//
// Setup: several sequences of different lengths whose physical blocks are a shuffled permutation
// of the pool (so logical and physical order differ, and sequences interleave), cached entirely;
// one step of queries mixing decode tokens (T = 1 per sequence), prefill chunks and a padding
// token (pos -1, slot -1); and the same for a lone decode token (T = 1). Unused cache rows hold
// NaN, so a read outside a token's own attended positions shows up as a NaN in the result.
//
// Tolerances: the cache writes are exact. Attention outputs are softmax-weighted means of values in
// [-1, 1]; the GPU uses an online softmax and other dot-product orders, each score is off by about
// 1e-6 and the weights by as much relatively, so |gpu - cpu| <= 2e-5 + 1e-5 |cpu| over sequences of
// up to 300 positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu.h"
#include "cpu/latent_attention.h"
#include "cpu/paged_attention.h"
#include "cuda/compare.h"
#include "cuda/device_buffer.h"
#include "cuda/kv_cache_write.h"
#include "cuda/latent_attention.h"
#include "cuda/paged_attention.h"

using namespace shardlm;
using test::all_bits_equal;
using test::all_close;
using test::cuda_sync;
using test::DeviceBuffer;

namespace {

constexpr double kRel = 1e-5, kAbs = 2e-5;

std::vector<float> rand_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

// Sequences laid out in a shared block pool: seq s's logical block j is blocks[start[s] + j].
struct Pool {
  int64_t block_size = 0, num_blocks = 0;
  std::vector<int64_t> lens;
  std::vector<int32_t> blocks, start;

  Pool(int64_t bs, std::vector<int64_t> seq_lens, int64_t spare_blocks, uint32_t seed)
      : block_size(bs), lens(std::move(seq_lens)) {
    int64_t used = 0;
    for (int64_t len : lens) used += (len + bs - 1) / bs;
    num_blocks = used + spare_blocks;
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    int64_t next = 0;
    for (int64_t len : lens) {
      start.push_back(static_cast<int32_t>(blocks.size()));
      for (int64_t j = 0; j < (len + bs - 1) / bs; ++j) blocks.push_back(perm[next++]);
    }
  }
  int64_t slot(size_t s, int64_t p) const {
    return static_cast<int64_t>(blocks[start[s] + p / block_size]) * block_size + p % block_size;
  }
  // Every position of every sequence, then a padding entry (slot -1).
  std::vector<int64_t> all_slots() const {
    std::vector<int64_t> out;
    for (size_t s = 0; s < lens.size(); ++s)
      for (int64_t p = 0; p < lens[s]; ++p) out.push_back(slot(s, p));
    out.push_back(-1);
    return out;
  }
};

// One step's tokens: (sequence, position) each; sequence -1 is a padding token.
struct Step {
  std::vector<int32_t> pos, table_start;
};

Step make_step(const Pool& pool, const std::vector<std::pair<int, int64_t>>& toks) {
  Step st;
  for (auto [s, p] : toks) {
    st.pos.push_back(s < 0 ? -1 : static_cast<int32_t>(p));
    st.table_start.push_back(s < 0 ? 0 : pool.start[s]);
  }
  return st;
}

// A step mixing everything (lens 1, 45, 100, 300): the only token of seq 0, a 15-token prefill
// chunk ending seq 1, decode of seq 2, a padding token, and a 50-token chunk ending seq 3.
Step mixed_step(const Pool& pool) {
  std::vector<std::pair<int, int64_t>> toks = {{0, 0}};
  for (int64_t p = 30; p < 45; ++p) toks.push_back({1, p});
  toks.push_back({2, 99});
  toks.push_back({-1, 0});
  for (int64_t p = 250; p < 300; ++p) toks.push_back({3, p});
  return make_step(pool, toks);
}

Step decode_step(const Pool& pool) { return make_step(pool, {{3, 299}}); }

// The CPU kernels take one host pointer per token.
std::vector<const int32_t*> host_block_table(const Pool& pool, const Step& st) {
  std::vector<const int32_t*> bt;
  for (int32_t s0 : st.table_start) bt.push_back(pool.blocks.data() + s0);
  return bt;
}

struct GqaCase {
  int64_t n_heads, n_kv, head_dim, window;
};

}  // namespace

TEST(CudaAttention, PagedAttentionMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Pool pool(16, {1, 45, 100, 300}, 5, 7);
  const std::vector<int64_t> slots = pool.all_slots();
  const int64_t n_write = static_cast<int64_t>(slots.size());
  DeviceBuffer<int32_t> d_blocks(pool.blocks);
  DeviceBuffer<int64_t> d_slots(slots);

  // Query heads per KV head: 4, 1 (MHA), 12 (a block of 8 heads and one of 4 with idle warps),
  // 16 (two full blocks), 8 at head_dim 256 (the largest staged round).
  for (const GqaCase& c : {GqaCase{8, 2, 64, 0}, GqaCase{8, 2, 128, 0}, GqaCase{8, 2, 128, 37}, GqaCase{4, 4, 96, 0},
                           GqaCase{32, 8, 128, 0}, GqaCase{24, 2, 64, 0}, GqaCase{16, 1, 128, 21},
                           GqaCase{8, 1, 256, 0}}) {
    SCOPED_TRACE(testing::Message() << "heads " << c.n_heads << "/" << c.n_kv << ", head_dim " << c.head_dim
                                    << ", window " << c.window);
    const int64_t row = c.n_kv * c.head_dim;
    const int64_t cache_len = pool.num_blocks * pool.block_size * row;
    const std::vector<float> k = rand_vec(n_write * row, 101), v = rand_vec(n_write * row, 102);
    std::vector<float> k_cache(cache_len, nan), v_cache(cache_len, nan);
    cpu::kv_cache_write(k.data(), v.data(), n_write, slots.data(), c.n_kv, c.head_dim, k_cache.data(),
                        v_cache.data());

    DeviceBuffer<float> d_k(k), d_v(v);
    DeviceBuffer<float> d_kc(std::vector<float>(cache_len, nan)), d_vc(std::vector<float>(cache_len, nan));
    cuda::kv_cache_write(d_k.get(), d_v.get(), n_write, d_slots.get(), c.n_kv, c.head_dim, d_kc.get(), d_vc.get(),
                         nullptr);
    cuda_sync("kv_cache_write");
    ASSERT_TRUE(all_bits_equal(d_kc.download(), k_cache));
    ASSERT_TRUE(all_bits_equal(d_vc.download(), v_cache));

    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    for (const Step& st : {mixed_step(pool), decode_step(pool)}) {
      const int64_t T = static_cast<int64_t>(st.pos.size());
      SCOPED_TRACE(testing::Message() << "T " << T);
      const std::vector<float> q = rand_vec(T * c.n_heads * c.head_dim, 103);
      const std::vector<const int32_t*> bt = host_block_table(pool, st);
      std::vector<float> want(T * c.n_heads * c.head_dim);
      cpu::paged_attention(q.data(), T, c.n_heads, c.n_kv, c.head_dim, k_cache.data(), v_cache.data(),
                           pool.block_size, bt.data(), st.pos.data(), c.window, scale, want.data());

      DeviceBuffer<float> d_q(q), d_out(std::vector<float>(want.size(), nan));
      DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start);
      cuda::paged_attention(d_q.get(), T, c.n_heads, c.n_kv, c.head_dim, d_kc.get(), d_vc.get(), pool.block_size,
                            d_blocks.get(), d_start.get(), d_pos.get(), c.window, scale, d_out.get(), nullptr);
      cuda_sync("paged_attention");
      EXPECT_TRUE(all_close(d_out.download(), want, kRel, kAbs));
    }
  }
}

namespace {
struct MlaCase {
  int64_t n_heads, kv_lora, rope_dim, block_size;
};
}  // namespace

TEST(CudaAttention, LatentAttentionMatchesCpu) {
  SHARDLM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // DeepSeek-V3 / Kimi K2 shapes (a tensor-parallel shard of 16 heads), and odd sizes.
  // Heads per block: 8 (two full blocks), 3 (one partial block), 20 (8 + 8 + 4 with idle warps), 1.
  for (const MlaCase& c : {MlaCase{16, 512, 64, 64}, MlaCase{16, 512, 64, 16}, MlaCase{3, 80, 16, 16},
                           MlaCase{20, 512, 64, 16}, MlaCase{1, 96, 32, 16}}) {
    SCOPED_TRACE(testing::Message() << "heads " << c.n_heads << ", kv_lora " << c.kv_lora << ", rope " << c.rope_dim
                                    << ", block " << c.block_size);
    const Pool pool(c.block_size, {1, 45, 100, 300}, 3, 9);
    const std::vector<int64_t> slots = pool.all_slots();
    const int64_t n_write = static_cast<int64_t>(slots.size());
    const int64_t row = c.kv_lora + c.rope_dim;
    const int64_t cache_len = pool.num_blocks * pool.block_size * row;
    const std::vector<float> lat = rand_vec(n_write * c.kv_lora, 201), kr = rand_vec(n_write * c.rope_dim, 202);
    std::vector<float> cache(cache_len, nan);
    cpu::latent_cache_write(lat.data(), kr.data(), n_write, slots.data(), c.kv_lora, c.rope_dim, cache.data());

    DeviceBuffer<float> d_lat(lat), d_kr(kr), d_cache(std::vector<float>(cache_len, nan));
    DeviceBuffer<int64_t> d_slots(slots);
    DeviceBuffer<int32_t> d_blocks(pool.blocks);
    cuda::latent_cache_write(d_lat.get(), d_kr.get(), n_write, d_slots.get(), c.kv_lora, c.rope_dim, d_cache.get(),
                             nullptr);
    cuda_sync("latent_cache_write");
    ASSERT_TRUE(all_bits_equal(d_cache.download(), cache));

    // DeepSeek's softmax scale: 1 / sqrt(qk_nope + qk_rope) = 1 / sqrt(192).
    const float scale = 1.0f / std::sqrt(192.0f);
    for (const Step& st : {mixed_step(pool), decode_step(pool)}) {
      const int64_t T = static_cast<int64_t>(st.pos.size());
      SCOPED_TRACE(testing::Message() << "T " << T);
      const std::vector<float> ql = rand_vec(T * c.n_heads * c.kv_lora, 203);
      const std::vector<float> qr = rand_vec(T * c.n_heads * c.rope_dim, 204);
      const std::vector<const int32_t*> bt = host_block_table(pool, st);
      std::vector<float> want(T * c.n_heads * c.kv_lora);
      cpu::latent_attention(ql.data(), qr.data(), T, c.n_heads, c.kv_lora, c.rope_dim, cache.data(), pool.block_size,
                            bt.data(), st.pos.data(), scale, want.data());

      DeviceBuffer<float> d_ql(ql), d_qr(qr), d_out(std::vector<float>(want.size(), nan));
      DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start);
      cuda::latent_attention(d_ql.get(), d_qr.get(), T, c.n_heads, c.kv_lora, c.rope_dim, d_cache.get(),
                             pool.block_size, d_blocks.get(), d_start.get(), d_pos.get(), scale, d_out.get(), nullptr);
      cuda_sync("latent_attention");
      EXPECT_TRUE(all_close(d_out.download(), want, kRel, kAbs));
    }
  }
}
