// The attention tests' shared setup (test_cuda_attention.cpp: the kernels;
// test_cuda_attention_backend.cpp: CudaBackend's choice among them): sequences cached in a
// shuffled block pool, steps of (sequence, position) tokens, random values, and the CPU kernels'
// per-token block tables.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace shardlm::test {

// Kernel tolerances against the CPU (see the kernel test file): the fp32 kernels, and the
// tensor-core ones (bf16 operands: |gpu - cpu| <= 4e-3 + 1e-2 |cpu|).
inline constexpr double kRel = 1e-5, kAbs = 2e-5;
inline constexpr double kMmaRel = 1e-2, kMmaAbs = 4e-3;

inline std::vector<float> rand_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

// The CUDA kernels' GQA cache layout, whole rows per slot ([slot][KV head][dim]), written on the
// host: what cuda::kv_cache_write must produce and what the device caches are loaded with. The CPU
// kernels keep a KV head's rows of a block together instead (cpu::kv_cache_write), so the CPU
// references read caches of their own, written from the same rows.
inline void row_cache_write(const std::vector<float>& k, const std::vector<float>& v, const std::vector<int64_t>& slots,
                            int64_t row, std::vector<float>& k_cache, std::vector<float>& v_cache) {
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    std::copy_n(k.begin() + static_cast<int64_t>(t) * row, row, k_cache.begin() + slots[t] * row);
    std::copy_n(v.begin() + static_cast<int64_t>(t) * row, row, v_cache.begin() + slots[t] * row);
  }
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

inline Step make_step(const Pool& pool, const std::vector<std::pair<int, int64_t>>& toks) {
  Step st;
  for (auto [s, p] : toks) {
    st.pos.push_back(s < 0 ? -1 : static_cast<int32_t>(p));
    st.table_start.push_back(s < 0 ? 0 : pool.start[s]);
  }
  return st;
}

// The sequence lengths every case caches: 1300 spans three partitions.
inline const std::vector<int64_t> kSeqLens = {1, 45, 100, 300, 1300};

// A step mixing everything: the only token of seq 0, a 15-token prefill chunk ending seq 1, decode
// of seq 2, a padding token, a 50-token chunk ending seq 3, a chunk of seq 4 across its first
// partition boundary (positions 501..523) and the decode token of seq 4 (three partitions). For
// the tiled prefill kernel, tiles of 4 hold positions 509..512 (a run across the boundary) and
// 521, 522, 523, 1299 (tokens of two and of three partitions in one run); tiles of 2 hold
// 511, 512 and 523, 1299.
inline Step mixed_step(const Pool& pool) {
  std::vector<std::pair<int, int64_t>> toks = {{0, 0}};
  for (int64_t p = 30; p < 45; ++p) toks.push_back({1, p});
  toks.push_back({2, 99});
  toks.push_back({-1, 0});
  for (int64_t p = 250; p < 300; ++p) toks.push_back({3, p});
  for (int64_t p = 501; p < 524; ++p) toks.push_back({4, p});
  toks.push_back({4, 1299});
  return make_step(pool, toks);
}

// The CPU kernels take one host pointer per token.
inline std::vector<const int32_t*> host_block_table(const Pool& pool, const Step& st) {
  std::vector<const int32_t*> bt;
  for (int32_t s0 : st.table_start) bt.push_back(pool.blocks.data() + s0);
  return bt;
}

}  // namespace shardlm::test
