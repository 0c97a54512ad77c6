// The profile steps run before the KV cache is sized: their shape (the largest step the scheduler
// can issue, every position read written first, no two tokens writing one slot, the longest
// context reached) over many scheduler settings, and a run on real decoders that leaves no cache
// and no state that changes the next step's results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <string>
#include <vector>

#include "arch/model.h"
#include "common/model_steps.h"
#include "common/tiny_model.h"
#include "compute/backend.h"
#include "core/error.h"
#include "engine/profile_steps.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"

namespace shardlm {
namespace {

struct Case {
  int64_t max_batch_tokens, max_seqs, block_size, max_len;
  int stages;
  int64_t max_logit_rows = 0;
};

std::string name(const Case& c) {
  return std::to_string(c.max_batch_tokens) + " tokens, " + std::to_string(c.max_seqs) + " seqs, blocks of " +
         std::to_string(c.block_size) + ", context " + std::to_string(c.max_len) + ", " + std::to_string(c.stages) +
         " stages, " + std::to_string(c.max_logit_rows) + " logit rows";
}

// Checks one step; `written` holds the slots earlier steps wrote and gains this step's.
void check_step(const ForwardBatch& b, const Case& c, int32_t blocks, std::unordered_set<int64_t>* written,
                const std::string& what) {
  const int64_t T = b.num_tokens();
  ASSERT_EQ(static_cast<int64_t>(b.positions.size()), T) << what;
  ASSERT_EQ(static_cast<int64_t>(b.slots.size()), T) << what;
  ASSERT_EQ(b.sample_rows.size(), b.logit_rows.size()) << what;
  if (T == 0) {
    EXPECT_TRUE(b.logit_rows.empty() && b.sample_rows.empty()) << what;
    return;
  }
  const int64_t S = static_cast<int64_t>(b.seq_block_start.size()) - 1;
  std::unordered_set<int64_t> mine;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = b.token_seq[t];
    ASSERT_TRUE(s >= 0 && s < S) << what;
    const int32_t* table = b.blocks.data() + b.seq_block_start[s];
    const int64_t table_len = b.seq_block_start[s + 1] - b.seq_block_start[s];
    const int64_t p = b.positions[t];
    ASSERT_TRUE(p >= 0 && p < c.max_len) << what << " token " << t << " position " << p;
    ASSERT_LT(p / c.block_size, table_len) << what;
    for (int64_t i = 0; i < table_len; ++i) ASSERT_TRUE(table[i] >= 0 && table[i] < blocks) << what;
    EXPECT_EQ(b.slots[t], int64_t{table[p / c.block_size]} * c.block_size + p % c.block_size) << what;
    EXPECT_TRUE(mine.insert(b.slots[t]).second) << what << ": two tokens write slot " << b.slots[t];
  }
  written->insert(mine.begin(), mine.end());
  // A token attends to every earlier position of its sequence: each must have been written (by
  // this step, whose K/V land before attention, or by an earlier one). A sequence's last token
  // reads what all of its tokens read.
  std::vector<int64_t> last(static_cast<size_t>(S), -1);
  for (int64_t t = 0; t < T; ++t) last[b.token_seq[t]] = std::max<int64_t>(last[b.token_seq[t]], b.positions[t]);
  for (int64_t s = 0; s < S; ++s) {
    const int32_t* table = b.blocks.data() + b.seq_block_start[s];
    for (int64_t q = 0; q <= last[s]; ++q) {
      const int64_t slot = int64_t{table[q / c.block_size]} * c.block_size + q % c.block_size;
      ASSERT_TRUE(written->count(slot)) << what << ": sequence " << s << " reads position " << q << " (slot " << slot
                                        << "), which no step wrote";
    }
  }
  // A row at every sequence's last token, and as many more (prefill tokens, as prompt logprobs
  // score them) as the logit-row cap allows, in token order; each sampled with every filter on and
  // a top alternative.
  const int64_t cap = (c.max_logit_rows > 0 ? std::max(c.max_logit_rows, c.max_seqs) : c.max_seqs);
  const int64_t rows = std::min(T, std::max(S, (cap + c.stages - 1) / c.stages));
  ASSERT_EQ(static_cast<int64_t>(b.logit_rows.size()), rows) << what;
  std::vector<bool> is_row(static_cast<size_t>(T), false);
  int64_t top = 0;
  for (size_t i = 0; i < b.logit_rows.size(); ++i) {
    const int32_t row = b.logit_rows[i];
    ASSERT_TRUE(row >= 0 && row < T && (i == 0 || row > b.logit_rows[i - 1])) << what;
    is_row[static_cast<size_t>(row)] = true;
    const SampleRow& r = b.sample_rows[i];
    EXPECT_GT(r.temperature, 0) << what;
    EXPECT_TRUE(r.top_k > 0 && r.top_p < 1 && r.min_p > 0) << what;
    EXPECT_EQ(r.position, b.positions[row]) << what;
    EXPECT_TRUE(r.top_n == 1 && r.top_begin == top) << what;
    top += r.top_n;
  }
  for (int64_t t = 0; t < T; ++t) {
    if (t + 1 == T || b.token_seq[t + 1] != b.token_seq[t]) {
      EXPECT_TRUE(is_row[static_cast<size_t>(t)]) << what;
    }
  }
}

TEST(ProfileSteps, LargestStepWithEveryReadWritten) {
  std::vector<Case> cases;
  for (int64_t tokens : {1, 5, 16, 17, 48, 300, 2048, 30000})
    for (int64_t seqs : {1, 2, 5, 64})
      for (int64_t bs : {1, 16})
        for (int64_t len : {8, 512, 4096})
          for (int stages : {1, 3})
            for (int64_t logit_rows : {0, 200}) cases.push_back({tokens, seqs, bs, len, stages, logit_rows});
  for (const Case& c : cases) {
    const std::string what = name(c);
    SchedulerConfig cfg;
    cfg.max_batch_tokens = c.max_batch_tokens;
    cfg.max_seqs = c.max_seqs;
    cfg.max_logit_rows = c.max_logit_rows;
    cfg.block_size = c.block_size;
    const ProfileSteps s = make_profile_steps(cfg, c.max_len, 1000, c.stages);
    const int64_t seqs = (c.max_seqs + c.stages - 1) / c.stages;  // a micro-batch's share
    const int64_t tokens = std::min(c.max_batch_tokens, seqs * c.max_len);
    ASSERT_EQ(s.peak.num_tokens(), tokens) << what;
    ASSERT_LE(static_cast<int64_t>(s.peak.seq_block_start.size()) - 1, seqs) << what;
    std::unordered_set<int64_t> written;
    check_step(s.peak, c, s.blocks, &written, what + " (peak)");
    check_step(s.decode, c, s.blocks, &written, what + " (decode)");
    for (int32_t id : s.peak.tokens) ASSERT_TRUE(id >= 0 && id < 1000) << what;
    // Every row samples on the longest path, penalties included, on as many distinct seen tokens
    // as its sequence can hold (a CUDA backend's penalized copy of the logits and its seen-token
    // entries are allocated before the KV budget is measured).
    for (const ForwardBatch* b : {&s.peak, &s.decode}) {
      ASSERT_EQ(b->sample_rows.size(), b->logit_rows.size()) << what;
      ASSERT_EQ(b->sampled(), !b->logit_rows.empty()) << what;  // the seen ranges checked too
      int64_t next = 0;
      for (size_t r = 0; r < b->sample_rows.size(); ++r) {
        const SampleRow& row = b->sample_rows[r];
        ASSERT_TRUE(row.edited() && row.repetition_penalty != 1.0f && row.edits_begin == next) << what;
        ASSERT_EQ(row.edits_count, std::min<int64_t>(row.position + 1, 1000)) << what;
        next += row.edits_count;
      }
      ASSERT_EQ(next, static_cast<int64_t>(b->token_edits.size())) << what;
      for (const TokenEdit& t : b->token_edits) ASSERT_TRUE(t.token >= 0 && t.token < 1000) << what;
    }
    if (tokens > c.block_size) {
      // As many sequences as the first chunk's filled block leaves tokens for (the decode step
      // has the whole cap), and a token at the context's last block in both steps.
      if (c.max_len >= c.block_size) {
        EXPECT_GE(static_cast<int64_t>(s.peak.seq_block_start.size()) - 1, std::min(seqs, tokens - c.block_size + 1))
            << what;
      }
      EXPECT_EQ(s.decode.num_tokens(), seqs) << what;
      const int64_t last_block = (c.max_len - 1) / c.block_size * c.block_size;
      EXPECT_EQ(*std::max_element(s.decode.positions.begin(), s.decode.positions.end()), last_block) << what;
      if (seqs > 1) {
        EXPECT_EQ(*std::max_element(s.peak.positions.begin(), s.peak.positions.end()),
                  std::max(last_block, std::min(tokens - 1, c.max_len - 1)))
            << what;
      }
    } else {
      EXPECT_EQ(s.decode.num_tokens(), 0) << what;
    }
  }
}

TEST(ProfileSteps, RejectsEmptySettings) {
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 0;
  EXPECT_THROW(make_profile_steps(cfg, 512, 100), Error);
  cfg.max_batch_tokens = 16;
  EXPECT_THROW(make_profile_steps(cfg, 0, 100), Error);
}

std::vector<float> reference_logits(Model& m) {
  return test::prefill_then_decode(m, {{5, 9, 2, 7, 1}, {3, 3, 8}, {11, 4, 6, 2, 9, 10, 12}});
}

// After the profile steps the model has no cache, and the steps after a new one give the bits a
// model that never ran them gives, on a backend of its own (so a trace the steps left in the
// profiled model's backend, not only in the model, would show): dense, MoE, MLA.
TEST(ProfileSteps, RunLeavesNoCacheAndNoTrace) {
  for (const char* config : {"tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3"}) {
    const std::string dir = test::tiny_model_dir(config, DType::F32, 5);
    const ModelSpec spec = ModelSpec::load(dir);
    auto ckpt = Checkpoint::open(dir);
    auto fresh_backend = make_backend("cpu");
    auto fresh = build_model(spec, *ckpt, *fresh_backend);
    const std::vector<float> want = reference_logits(*fresh);
    auto backend = make_backend("cpu");
    auto profiled = build_model(spec, *ckpt, *backend);
    SchedulerConfig cfg;
    cfg.max_batch_tokens = 96;
    cfg.max_seqs = 6;
    const ProfileResult r = run_profile_steps(*profiled, *backend, /*leader=*/true, cfg, DType::F32);
    EXPECT_EQ(r.tokens, 96) << config;
    EXPECT_EQ(r.grew_bytes, -1) << config << ": the CPU has no device memory to read";
    ForwardBatch one;
    one.clear();
    const int32_t tok = 3;
    one.add_chunk(&tok, 0, 1, {0}, 16, false);
    try {
      profiled->forward(one, nullptr);
      ADD_FAILURE() << config << ": a forward after the profile steps ran without a cache";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("forward before allocate_kv_cache"), std::string::npos) << e.what();
    }
    const std::vector<float> got = reference_logits(*profiled);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << config;
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << config;
  }
}

}  // namespace
}  // namespace shardlm
