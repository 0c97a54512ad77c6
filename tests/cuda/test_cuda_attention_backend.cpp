// CudaBackend::attention and latent_attention choosing among the attention kernels (tested
// against the CPU in test_cuda_attention.cpp): the tiled prefill kernel for a step of prefill
// chunks, the tensor-core kernels for an eager step's runs beside the fp32 kernels for its single
// tokens, and the split launch for a lone long decode token. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bf16_bits.h"
#include "common/gpu.h"
#include "compute/backend.h"
#include "compute/cuda_backend.h"
#include "cpu/latent_attention.h"
#include "cpu/paged_attention.h"
#include "cuda/attention_cases.h"
#include "cuda/attention_partitions.h"
#include "cuda/compare.h"
#include "cuda/device_buffer.h"
#include "cuda/run_positions.h"
#include "kv_cache_format.h"

using namespace shardlm;
using namespace shardlm::test;  // attention_cases.h
using test::all_bits_equal;
using test::all_close;
using test::cuda_sync;
using test::DeviceBuffer;

namespace {

// A cuda backend with prefill attention on bf16 tensor cores; *gpu its CudaBackend (null if not).
std::unique_ptr<ComputeBackend> tensor_core_backend(CudaBackend** gpu) {
  auto backend = make_backend("cuda");
  *gpu = dynamic_cast<CudaBackend*>(backend.get());
  if (*gpu != nullptr) (*gpu)->set_prefill_attention_bf16(true);
  return backend;
}

// Runs call(tables, out) on a step without the host tables (all of it on the fp32 kernels) and
// with them (prefill attention on tensor cores: its runs there, its `singles` single tokens on
// the fp32 kernels). The first must be within the fp32 kernels' tolerance of the CPU (want); in
// the second, each single token's row (row floats) must have the first's bits, and each run
// token's be within the tensor cores' tolerance of want and not the fp32 bits.
template <class Call>
void check_with_and_without_host_tables(const CudaBackend& gpu, const Pool& pool, const Step& st,
                                        const int32_t* d_blocks, const int32_t* d_start, int64_t row,
                                        const std::vector<float>& want, int64_t singles, const Call& call) {
  const int64_t T = static_cast<int64_t>(st.pos.size());
  const int32_t max_pos = *std::max_element(st.pos.begin(), st.pos.end());
  std::vector<float> outs[2];
  for (bool host : {false, true}) {
    const BlockTables tables{d_blocks, d_start, host ? pool.blocks.data() : nullptr,
                             host ? st.table_start.data() : nullptr, max_pos};
    DeviceBuffer<float> d_out(std::vector<float>(want.size(), std::numeric_limits<float>::quiet_NaN()));
    call(tables, d_out.get());
    EXPECT_EQ(gpu.last_attention_bf16(), host) << "host tables " << host;
    EXPECT_EQ(gpu.last_attention_singles(), host ? singles : 0) << "host tables " << host;
    cuda_sync("backend attention");
    outs[host] = d_out.download();
  }
  EXPECT_TRUE(all_close(outs[0], want, kRel, kAbs)) << "fp32 kernels";
  for (int64_t t = 0; t < T; ++t) {
    const auto at = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + t * row, v.begin() + (t + 1) * row);
    };
    if (!cuda::in_run(st.table_start.data(), T, t)) {
      EXPECT_TRUE(all_bits_equal(at(outs[1]), at(outs[0]))) << "single token " << t;
      continue;
    }
    EXPECT_TRUE(all_close(at(outs[1]), at(want), kMmaRel, kMmaAbs)) << "token " << t << " of a run";
    if (st.pos[t] >= 0) {
      EXPECT_FALSE(all_bits_equal(at(outs[1]), at(outs[0]))) << "token " << t << " of a run: the fp32 kernels' bits";
    }
  }
}

// An attention output's bf16 twin (ActivationsOut): each element the rounding of the output's.
void expect_twin_of(const std::vector<float>& out, const std::vector<uint16_t>& twin) {
  ASSERT_EQ(out.size(), twin.size());
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (twin[i] != bf16_bits::from_f32(out[i]) && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << "twin elements not their output's rounding, the first " << first;
}

}  // namespace

// CudaBackend::attention picks the tiled prefill kernel for a step of prefill chunks when it
// has the host copy of the table starts (an eager step) and the layer has no sliding window, the
// per-token kernel otherwise; the bits are the same. With set_prefill_attention_bf16, such a step
// (any window) runs on tensor cores instead. Every way, an output twin asked for is written by
// the kernel itself (no cast after it).
TEST(CudaAttention, BackendTilesPrefillChunks) {
  SHARDLM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto backend = make_backend("cuda");
  auto* gpu = dynamic_cast<CudaBackend*>(backend.get());
  ASSERT_NE(gpu, nullptr);
  const Pool pool(16, {1100, 560, 300}, 2, 13);
  const std::vector<int64_t> slots = pool.all_slots();
  const int64_t n_write = static_cast<int64_t>(slots.size());
  // Chunks of three sequences, tiled 4 tokens at a time in step order: one across position 1024
  // (tile 4 holds 1021..1024), one across 512 (tile 28 holds 509..512) and a third; tiles 23 and 40
  // hold the last three tokens of one chunk and the first of the next.
  std::vector<std::pair<int, int64_t>> toks;
  for (int64_t p = 1005; p < 1100; ++p) toks.push_back({0, p});
  for (int64_t p = 492; p < 560; ++p) toks.push_back({1, p});
  for (int64_t p = 263; p < 300; ++p) toks.push_back({2, p});
  const Step st = make_step(pool, toks);
  const int64_t T = static_cast<int64_t>(st.pos.size());
  // 200 tokens in 50 tiles x 16 heads (one per KV head): 800 blocks of the tiled kernel, over 4 per
  // multiprocessor on an H200 (528), so the backend does not split. (The tiled kernel's other head
  // groupings and sizes are in PagedAttentionMatchesCpu.)
  const int64_t nh = 16, nkv = 16, hd = 32, row = nkv * hd;
  const std::vector<float> k = rand_vec(n_write * row, 401), v = rand_vec(n_write * row, 402);
  const std::vector<float> q = rand_vec(T * nh * hd, 403);
  std::vector<float> kc(pool.num_blocks * pool.block_size * row, nan), vc(kc.size(), nan), want(T * nh * hd);
  std::vector<float> k_rows(kc.size(), nan), v_rows(kc.size(), nan);
  cpu::kv_cache_write(k.data(), v.data(), n_write, slots.data(), nkv, hd, pool.block_size, kc.data(), vc.data(),
                      cpu::CacheElem::F32);
  row_cache_write(k, v, slots, row, k_rows, v_rows);
  const std::vector<const int32_t*> bt = host_block_table(pool, st);
  DeviceBuffer<float> d_kc(k_rows), d_vc(v_rows), d_q(q);
  DeviceBuffer<int32_t> d_blocks(pool.blocks), d_start(st.table_start), d_pos(st.pos);
  for (int64_t window : {int64_t{0}, int64_t{100}}) {
    SCOPED_TRACE(testing::Message() << "window " << window);
    cpu::paged_attention(q.data(), T, nh, nkv, hd, kc.data(), vc.data(), cpu::CacheElem::F32, pool.block_size,
                         bt.data(), st.pos.data(), window, 0.088f, want.data());
    std::vector<float> first;
    for (bool host : {true, false}) {
      const BlockTables tables{d_blocks.get(), d_start.get(), host ? pool.blocks.data() : nullptr,
                               host ? st.table_start.data() : nullptr, 1099};
      DeviceBuffer<float> d_out(std::vector<float>(want.size(), nan));
      DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(want.size(), 0xdead));
      const int64_t casts = gpu->activation_casts();
      gpu->attention(d_q.get(), T, nh, nkv, hd, KvCacheRef{d_kc.get(), d_vc.get(), DType::F32}, pool.block_size, tables,
                     d_pos.get(), window, 0.088f, ActivationsOut{d_out.get(), d_twin.get()});
      EXPECT_EQ(gpu->activation_casts(), casts) << "the twin cast after the kernel, host tables " << host;
      EXPECT_EQ(gpu->last_attention_tiled(), host && window <= 0) << "host tables " << host;
      EXPECT_EQ(gpu->last_attention_parts(), 1);
      cuda_sync("backend attention");
      const std::vector<float> got = d_out.download();
      expect_twin_of(got, d_twin.download());
      if (first.empty()) {
        first = got;
        EXPECT_TRUE(all_close(got, want, kRel, kAbs));
      }
      EXPECT_TRUE(all_bits_equal(got, first)) << "host tables " << host;
    }
    // With prefill attention on bf16 tensor cores: the same step runs prefill_attention_mma.h (any
    // window), within its tolerance of the CPU; without the host tables, the fp32 kernels again.
    gpu->set_prefill_attention_bf16(true);
    for (bool host : {true, false}) {
      const BlockTables tables{d_blocks.get(), d_start.get(), host ? pool.blocks.data() : nullptr,
                               host ? st.table_start.data() : nullptr, 1099};
      DeviceBuffer<float> d_out(std::vector<float>(want.size(), nan));
      DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(want.size(), 0xdead));
      const int64_t casts = gpu->activation_casts();
      gpu->attention(d_q.get(), T, nh, nkv, hd, KvCacheRef{d_kc.get(), d_vc.get(), DType::F32}, pool.block_size, tables,
                     d_pos.get(), window, 0.088f, ActivationsOut{d_out.get(), d_twin.get()});
      EXPECT_EQ(gpu->activation_casts(), casts) << "the twin cast after the kernel, bf16, host tables " << host;
      EXPECT_EQ(gpu->last_attention_bf16(), host) << "host tables " << host;
      EXPECT_EQ(gpu->last_attention_tiled(), host) << "host tables " << host;
      cuda_sync("backend attention, bf16");
      const std::vector<float> got = d_out.download();
      expect_twin_of(got, d_twin.download());
      if (host) {
        EXPECT_TRUE(all_close(got, want, kMmaRel, kMmaAbs));
      } else {
        EXPECT_TRUE(all_bits_equal(got, first)) << "fp32 kernels without the host tables";
      }
    }
    gpu->set_prefill_attention_bf16(false);
  }
}

// The positions of a step's fp32 launch beside tensor-core runs (run_positions.h): the mixed
// step's tokens in runs (seq 1's and seq 3's chunks, seq 4's chunk and its decode token after it)
// read -1, the others (seq 0's only token, seq 2's decode token, the padding token) keep theirs;
// a step of one token keeps it.
TEST(CudaAttention, SingleTokenPositionsMaskTheRuns) {
  SHARDLM_REQUIRE_GPU();
  const Pool pool{16, kSeqLens, 5, 7};
  for (const Step& st : {mixed_step(pool), make_step(pool, {{2, 99}})}) {
    const int64_t T = static_cast<int64_t>(st.pos.size());
    std::vector<int32_t> want(st.pos);
    int64_t singles = 0;
    for (int64_t t = 0; t < T; ++t) {
      const bool run = t > 0 && st.table_start[t - 1] == st.table_start[t];
      const bool next = t + 1 < T && st.table_start[t + 1] == st.table_start[t];
      EXPECT_EQ(cuda::in_run(st.table_start.data(), T, t), run || next) << t;
      if (run || next) want[t] = -1;
      singles += !(run || next);
    }
    EXPECT_EQ(singles, T == 1 ? 1 : 3);
    DeviceBuffer<int32_t> d_pos(st.pos), d_start(st.table_start), d_out(std::vector<int32_t>(T, 7777));
    cuda::launch_single_token_positions(d_pos.get(), d_start.get(), T, d_out.get(), nullptr);
    cuda_sync("single_token_positions");
    EXPECT_EQ(d_out.download(), want);
  }
}

// CudaBackend::attention with prefill attention on bf16 tensor cores and the host tables: a step's
// runs (a 40-token chunk: one query head a tile; a 3-token chunk: its KV head's 4 query heads a
// tile) on prefill_attention_mma.h, its single tokens (a decode token, a padding token) on the
// fp32 kernels with the bits the step gets without the host tables (all of it in fp32); in a step
// of mostly chunks as in one of mostly decode tokens (a 2-token run beside three decode tokens),
// which the fp32 path runs per token.
TEST(CudaAttention, BackendRunsGqaChunksOnTensorCoresBesideDecode) {
  SHARDLM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CudaBackend* gpu = nullptr;
  const auto backend = tensor_core_backend(&gpu);
  ASSERT_NE(gpu, nullptr);
  const Pool pool(16, {300, 90, 50, 70}, 2, 19);
  const std::vector<int64_t> slots = pool.all_slots();
  const int64_t n_write = static_cast<int64_t>(slots.size());
  const int64_t nh = 8, nkv = 2, hd = 64, row = nkv * hd;
  const std::vector<float> k = rand_vec(n_write * row, 621), v = rand_vec(n_write * row, 622);
  std::vector<float> kc(pool.num_blocks * pool.block_size * row, nan), vc(kc.size(), nan);
  std::vector<float> k_rows(kc.size(), nan), v_rows(kc.size(), nan);
  cpu::kv_cache_write(k.data(), v.data(), n_write, slots.data(), nkv, hd, pool.block_size, kc.data(), vc.data(),
                      cpu::CacheElem::F32);
  row_cache_write(k, v, slots, row, k_rows, v_rows);
  DeviceBuffer<float> d_kc(k_rows), d_vc(v_rows);
  DeviceBuffer<int32_t> d_blocks(pool.blocks);
  std::vector<std::pair<int, int64_t>> chunks;
  for (int64_t p = 260; p < 300; ++p) chunks.push_back({0, p});
  chunks.insert(chunks.end(), {{1, 89}, {-1, 0}, {2, 47}, {2, 48}, {2, 49}});
  const std::vector<std::pair<int, int64_t>> decode = {{0, 299}, {1, 89}, {3, 68}, {3, 69}, {2, 49}};
  for (const auto& [toks, singles, packed] : {std::tuple{chunks, 2, 1}, std::tuple{decode, 3, 1}}) {
    const Step st = make_step(pool, toks);
    const int64_t T = static_cast<int64_t>(st.pos.size());
    SCOPED_TRACE(testing::Message() << T << " tokens");
    const std::vector<float> q = rand_vec(T * nh * hd, 623);
    std::vector<float> want(T * nh * hd);
    const std::vector<const int32_t*> bt = host_block_table(pool, st);
    cpu::paged_attention(q.data(), T, nh, nkv, hd, kc.data(), vc.data(), cpu::CacheElem::F32, pool.block_size,
                         bt.data(), st.pos.data(), 0, 0.125f, want.data());
    DeviceBuffer<float> d_q(q);
    DeviceBuffer<int32_t> d_start(st.table_start), d_pos(st.pos);
    check_with_and_without_host_tables(*gpu, pool, st, d_blocks.get(), d_start.get(), nh * hd, want, singles,
                                       [&](const BlockTables& tables, float* out) {
                                         gpu->attention(d_q.get(), T, nh, nkv, hd,
                                                        KvCacheRef{d_kc.get(), d_vc.get(), DType::F32}, pool.block_size,
                                                        tables, d_pos.get(), 0, 0.125f, out);
                                       });
    EXPECT_EQ(gpu->last_attention_packed_tiles(), packed);
    // With an output twin: both launches (the single tokens' fp32 one, the runs' tensor-core one)
    // write theirs with the output, so nothing is cast after them.
    const BlockTables tables{d_blocks.get(), d_start.get(), pool.blocks.data(), st.table_start.data(),
                             *std::max_element(st.pos.begin(), st.pos.end())};
    DeviceBuffer<float> d_out(std::vector<float>(want.size(), nan));
    DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(want.size(), 0xdead));
    const int64_t casts = gpu->activation_casts();
    gpu->attention(d_q.get(), T, nh, nkv, hd, KvCacheRef{d_kc.get(), d_vc.get(), DType::F32}, pool.block_size, tables,
                   d_pos.get(), 0, 0.125f, ActivationsOut{d_out.get(), d_twin.get()});
    EXPECT_EQ(gpu->last_attention_singles(), singles);
    EXPECT_EQ(gpu->activation_casts(), casts) << "a cast after the attention launches";
    cuda_sync("backend attention with a twin");
    expect_twin_of(d_out.download(), d_twin.download());
  }
}

namespace {

// An MLA step over a pool in DeepSeek-V3's geometry (kv_lora 512, rope 64, scale 1 / sqrt(192)):
// random latent rows at every cached position of an fp32 cache (unused rows NaN: a stray read
// shows), random queries for the step's tokens at nh heads, and the CPU kernel's result.
struct MlaStep {
  static constexpr int64_t lora = 512, rope = 64;
  const float scale = 1.0f / std::sqrt(192.0f);
  int64_t T, nh;
  std::vector<float> ql, qr, cache, want;
  MlaStep(const Pool& pool, const Step& st, int64_t heads, uint32_t seed)
      : T(static_cast<int64_t>(st.pos.size())), nh(heads) {
    const std::vector<int64_t> slots = pool.all_slots();
    const int64_t n_write = static_cast<int64_t>(slots.size());
    const std::vector<float> lat = rand_vec(n_write * lora, seed), kr = rand_vec(n_write * rope, seed + 1);
    ql = rand_vec(T * nh * lora, seed + 2);
    qr = rand_vec(T * nh * rope, seed + 3);
    cache.assign(pool.num_blocks * pool.block_size * (lora + rope), std::numeric_limits<float>::quiet_NaN());
    want.resize(T * nh * lora);
    cpu::latent_cache_write(lat.data(), kr.data(), n_write, slots.data(), lora, rope, cache.data(), KvFormat());
    const std::vector<const int32_t*> bt = host_block_table(pool, st);
    cpu::latent_attention(ql.data(), qr.data(), T, nh, lora, rope, cache.data(), KvFormat(), pool.block_size,
                          bt.data(), st.pos.data(), scale, want.data());
  }
};

}  // namespace

// CudaBackend::latent_attention with prefill attention on bf16 tensor cores: with the host tables
// a step's chunk runs prefill_latent_attention_mma.h (a DeepSeek-V3 shard's 16 heads, a chunk
// across positions 260..299), within its tolerance of the CPU, and its decode token of another
// sequence the fp32 kernel, the bits it gets without the host tables (all of the step on the fp32
// kernel).
TEST(CudaAttention, BackendRunsMlaPrefillOnTensorCores) {
  SHARDLM_REQUIRE_GPU();
  CudaBackend* gpu = nullptr;
  const auto backend = tensor_core_backend(&gpu);
  ASSERT_NE(gpu, nullptr);
  const Pool pool(16, {300, 90}, 2, 17);
  std::vector<std::pair<int, int64_t>> toks;
  for (int64_t p = 260; p < 300; ++p) toks.push_back({0, p});
  toks.push_back({1, 89});
  const Step st = make_step(pool, toks);
  const MlaStep m(pool, st, 16, 611);
  DeviceBuffer<float> d_cache(m.cache), d_ql(m.ql), d_qr(m.qr);
  DeviceBuffer<int32_t> d_blocks(pool.blocks), d_start(st.table_start), d_pos(st.pos);
  check_with_and_without_host_tables(
      *gpu, pool, st, d_blocks.get(), d_start.get(), m.nh * m.lora, m.want, 1,
      [&](const BlockTables& tables, float* out) {
        gpu->latent_attention(d_ql.get(), d_qr.get(), m.T, m.nh, m.lora, m.rope,
                              KvCacheRef{d_cache.get(), nullptr, DType::F32}, pool.block_size, tables, d_pos.get(),
                              m.scale, out);
      });
}

namespace {

// A lone decode token at position 1999 (eight partitions of 256) of step st, with the tables
// bound by its own position (an eager step: split into its partitions), by 4095 (a captured
// step's context limit: sixteen ways, the blocks past its eight doing nothing) and by nothing
// (unsplit); parts is what the backend's launch should choose.
struct SplitVariant {
  const char* what;
  BlockTables tables;
  int64_t parts;
};
std::vector<SplitVariant> lone_decode_variants(const Pool& pool, const Step& st, const int32_t* d_blocks,
                                               const int32_t* d_start) {
  return {{"bound 1999",
           {d_blocks, d_start, pool.blocks.data(), st.table_start.data(), 1999},
           1999 / cuda::kAttnPartition + 1},
          {"bound 4095", {d_blocks, d_start, nullptr, nullptr, 4095}, 4095 / cuda::kAttnPartition + 1},
          {"no bound", {d_blocks, d_start, nullptr, nullptr}, 1}};
}

}  // namespace

// CudaBackend::attention / latent_attention choose the split launch themselves: a lone decode
// token of 2000 positions (eight partitions of 256) on few heads leaves the device short of work,
// so with its own position as the bound (an eager step) it splits into its partitions; with the
// bound 4095 (a captured step's context limit: sixteen) sixteen ways, the blocks past the token's
// eight doing nothing; with no bound it runs unsplit. All give the same bits, and the CPU
// kernels' result within the kernel tolerance. The MLA call needs larger split states than the GQA one before it,
// so the backend's buffer grows between them.
TEST(CudaAttention, BackendSplitsLongDecodeAlone) {
  SHARDLM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();  // unused cache rows: a stray read shows
  CudaBackend* gpu = nullptr;
  const auto backend = tensor_core_backend(&gpu);  // a decode step stays on the fp32 kernels all the same
  ASSERT_NE(gpu, nullptr);
  const Pool pool(16, {2000}, 2, 11);
  const std::vector<int64_t> slots = pool.all_slots();
  const int64_t n_write = static_cast<int64_t>(slots.size());
  const Step st = make_step(pool, {{0, 1999}});
  const std::vector<const int32_t*> bt = host_block_table(pool, st);
  DeviceBuffer<int32_t> d_blocks(pool.blocks), d_start(st.table_start), d_pos(st.pos);
  DeviceBuffer<int64_t> d_slots(slots);
  const std::vector<SplitVariant> variants = lone_decode_variants(pool, st, d_blocks.get(), d_start.get());
  // Runs call(tables, out) for every variant; the outputs must have the same bits and match want.
  auto check = [&](size_t n, const std::vector<float>& want, const auto& call) {
    std::vector<float> first;
    for (const SplitVariant& v : variants) {
      SCOPED_TRACE(v.what);
      DeviceBuffer<float> d_out(std::vector<float>(n, nan));
      call(v.tables, d_out.get());
      EXPECT_EQ(gpu->last_attention_parts(), v.parts);
      EXPECT_FALSE(gpu->last_attention_bf16());
      cuda_sync("backend attention");
      const std::vector<float> got = d_out.download();
      if (first.empty()) {
        first = got;
        EXPECT_TRUE(all_close(got, want, kRel, kAbs));
      }
      EXPECT_TRUE(all_bits_equal(got, first));
    }
  };

  {  // GQA: 8 query heads on 2 KV heads, head_dim 128.
    const int64_t nh = 8, nkv = 2, hd = 128, row = nkv * hd;
    const std::vector<float> k = rand_vec(n_write * row, 301), v = rand_vec(n_write * row, 302);
    const std::vector<float> q = rand_vec(nh * hd, 303);
    std::vector<float> kc(pool.num_blocks * pool.block_size * row, nan), vc(kc.size(), nan), want(nh * hd);
    std::vector<float> k_rows(kc.size(), nan), v_rows(kc.size(), nan);
    cpu::kv_cache_write(k.data(), v.data(), n_write, slots.data(), nkv, hd, pool.block_size, kc.data(), vc.data(),
                        cpu::CacheElem::F32);
    row_cache_write(k, v, slots, row, k_rows, v_rows);
    cpu::paged_attention(q.data(), 1, nh, nkv, hd, kc.data(), vc.data(), cpu::CacheElem::F32, pool.block_size,
                         bt.data(), st.pos.data(), 0, 0.088f, want.data());
    DeviceBuffer<float> d_kc(k_rows), d_vc(v_rows), d_q(q);
    DeviceBuffer<uint16_t> d_twin(std::vector<uint16_t>(want.size(), 0xdead));
    check(want.size(), want, [&](const BlockTables& tables, float* out) {
      // The twin too, unsplit or split (attention_combine writes a split token's).
      d_twin.upload(std::vector<uint16_t>(want.size(), 0xdead));
      gpu->attention(d_q.get(), 1, nh, nkv, hd, KvCacheRef{d_kc.get(), d_vc.get(), DType::F32}, pool.block_size, tables,
                     d_pos.get(), 0, 0.088f, ActivationsOut{out, d_twin.get()});
      cuda_sync("backend attention with a twin");
      std::vector<float> got(want.size());
      test::cuda_ok(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
      expect_twin_of(got, d_twin.download());
    });
  }
  {  // MLA: 16 heads (a tp shard of DeepSeek-V3), kv_lora 512, rope 64.
    const int64_t nh = 16, lora = 512, rope = 64, row = lora + rope;
    const std::vector<float> lat = rand_vec(n_write * lora, 311), kr = rand_vec(n_write * rope, 312);
    const std::vector<float> ql = rand_vec(nh * lora, 313), qr = rand_vec(nh * rope, 314);
    std::vector<float> cache(pool.num_blocks * pool.block_size * row, nan), want(nh * lora);
    cpu::latent_cache_write(lat.data(), kr.data(), n_write, slots.data(), lora, rope, cache.data(),
                            cpu::CacheElem::F32);
    cpu::latent_attention(ql.data(), qr.data(), 1, nh, lora, rope, cache.data(), cpu::CacheElem::F32, pool.block_size,
                          bt.data(), st.pos.data(), 0.072f, want.data());
    DeviceBuffer<float> d_cache(cache), d_ql(ql), d_qr(qr);
    check(want.size(), want, [&](const BlockTables& tables, float* out) {
      gpu->latent_attention(d_ql.get(), d_qr.get(), 1, nh, lora, rope, KvCacheRef{d_cache.get(), nullptr, DType::F32},
                            pool.block_size, tables, d_pos.get(), 0.072f, out);
    });
  }
}

// CudaBackend::latent_attention with decode attention on bf16 tensor cores as well
// (decode_latent_attention_mma.h; a DeepSeek-V3 shard's 16 heads plus a partial block of 4): a
// decode token of 2000 positions (eight partitions) gets the same bits beside a prefill chunk
// (with the host tables: the chunk on the prefill kernel, the token on the decode kernel with the
// chunk masked), in a step the host does not see (every token on the decode kernel, as a captured
// step runs), alone and split along its positions (bound 1999), split sixteen ways (bound 4095: a
// captured step's context limit) and unsplit (no bound); all within the tensor cores' tolerance of
// the CPU. Off again beside prefill attention in fp32: the fp32 kernel.
TEST(CudaAttention, BackendRunsMlaDecodeOnTensorCores) {
  SHARDLM_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CudaBackend* gpu = nullptr;
  const auto backend = tensor_core_backend(&gpu);
  ASSERT_NE(gpu, nullptr);
  gpu->set_decode_attention_bf16(true);
  ASSERT_TRUE(gpu->decode_attention_bf16());
  const Pool pool(16, {2000, 300}, 2, 23);
  std::vector<std::pair<int, int64_t>> toks;
  for (int64_t p = 270; p < 300; ++p) toks.push_back({1, p});
  toks.push_back({0, 1999});
  const Step st = make_step(pool, toks), alone = make_step(pool, {{0, 1999}});
  const MlaStep m(pool, st, 20, 621);
  const int64_t T = m.T, nh = m.nh, lora = m.lora;
  const std::vector<float>& want = m.want;
  DeviceBuffer<float> d_cache(m.cache), d_ql(m.ql), d_qr(m.qr);
  DeviceBuffer<int32_t> d_blocks(pool.blocks), d_start(st.table_start), d_pos(st.pos);
  DeviceBuffer<int32_t> d_start1(alone.table_start), d_pos1(alone.pos);
  const int64_t last = T - 1;  // the decode token
  const std::vector<float> want_last(want.begin() + last * nh * lora, want.end());
  // The step's last n tokens (all of it, or the decode token alone) at positions pos.
  auto run = [&](int64_t n, const int32_t* pos, const BlockTables& tables) {
    const int64_t t0 = T - n;
    DeviceBuffer<float> d_out(std::vector<float>(n * nh * lora, nan));
    gpu->latent_attention(d_ql.get() + t0 * nh * lora, d_qr.get() + t0 * nh * m.rope, n, nh, lora, m.rope,
                          KvCacheRef{d_cache.get(), nullptr, DType::F32}, pool.block_size, tables, pos, m.scale,
                          d_out.get());
    cuda_sync("backend latent attention");
    return d_out.download();
  };
  const std::vector<float> beside =
      run(T, d_pos.get(), {d_blocks.get(), d_start.get(), pool.blocks.data(), st.table_start.data(), 1999});
  EXPECT_TRUE(gpu->last_attention_bf16());
  EXPECT_EQ(gpu->last_attention_singles(), 1);
  EXPECT_TRUE(all_close(beside, want, kMmaRel, kMmaAbs)) << "the chunk and the decode token";
  const std::vector<float> token(beside.begin() + last * nh * lora, beside.end());
  EXPECT_TRUE(all_close(token, want_last, kMmaRel, kMmaAbs));

  const std::vector<float> unseen =
      run(T, d_pos.get(), {d_blocks.get(), d_start.get(), nullptr, nullptr, 1999});
  EXPECT_TRUE(gpu->last_attention_bf16());
  EXPECT_EQ(gpu->last_attention_singles(), 0);
  EXPECT_TRUE(all_close(unseen, want, kMmaRel, kMmaAbs)) << "every token on the decode kernel";
  EXPECT_TRUE(all_bits_equal(std::vector<float>(unseen.begin() + last * nh * lora, unseen.end()), token));

  for (const SplitVariant& v : lone_decode_variants(pool, alone, d_blocks.get(), d_start1.get())) {
    SCOPED_TRACE(v.what);
    EXPECT_TRUE(all_bits_equal(run(1, d_pos1.get(), v.tables), token));
    EXPECT_EQ(gpu->last_attention_parts(), v.parts);
    EXPECT_TRUE(gpu->last_attention_bf16());
  }

  gpu->set_prefill_attention_bf16(false);
  EXPECT_FALSE(gpu->decode_attention_bf16());
  const std::vector<float> fp32 =
      run(1, d_pos1.get(), lone_decode_variants(pool, alone, d_blocks.get(), d_start1.get())[0].tables);
  EXPECT_FALSE(gpu->last_attention_bf16());
  EXPECT_TRUE(all_close(fp32, want_last, kRel, kAbs)) << "the fp32 kernel";
}
