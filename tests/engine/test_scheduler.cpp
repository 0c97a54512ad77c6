#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>

#include "engine/scheduler.h"

namespace shardlm {
namespace {

std::unique_ptr<Sequence> seq(const std::string& id, int64_t prompt_len, int64_t arrival) {
  auto s = std::make_unique<Sequence>();
  s->result.id = id;
  s->result.prompt_tokens.assign(prompt_len, 7);
  s->tokens = s->result.prompt_tokens;
  s->arrival = arrival;
  return s;
}

// Drives the scheduler as the engine does: a chunk that samples appends one token; sequences
// finish after `out` tokens. Returns the number of steps. With `preempted` (a budget that
// schedules every running sequence each step), it gets each finished sequence's preemption count,
// and each step checks that the sequences it dropped arrived after every one it kept.
int drive(Scheduler& sch, int64_t out, std::map<std::string, int64_t>* finished_len, int max_steps = 10000,
          std::map<std::string, int64_t>* preempted = nullptr) {
  int steps = 0;
  std::set<Sequence*> before;  // scheduled in the last step and not finished
  while (!sch.idle() && steps < max_steps) {
    auto chunks = sch.schedule();
    EXPECT_FALSE(chunks.empty());
    if (preempted) {
      std::set<Sequence*> now;
      for (auto& c : chunks) now.insert(c.seq);
      int64_t kept_newest = -1, dropped_oldest = INT64_MAX;
      for (Sequence* q : before) {
        if (now.count(q)) {
          kept_newest = std::max(kept_newest, q->arrival);
        } else {
          dropped_oldest = std::min(dropped_oldest, q->arrival);
        }
      }
      EXPECT_LT(kept_newest, dropped_oldest) << "step " << steps << " preempted an older sequence than it kept";
      before = std::move(now);
    }
    int64_t tokens = 0;
    std::vector<Sequence*> done;
    for (auto& c : chunks) {
      tokens += c.len;
      EXPECT_EQ(c.start, c.seq->computed);
      // Every token of the chunk has a block.
      EXPECT_GE(static_cast<int64_t>(c.seq->blocks.size()) * sch.config().block_size, c.start + c.len);
      c.seq->computed = c.start + c.len;
      if (c.samples) {
        c.seq->tokens.push_back(1);
        c.seq->result.output_tokens.push_back(1);
        if (static_cast<int64_t>(c.seq->result.output_tokens.size()) == out) done.push_back(c.seq);
      }
    }
    EXPECT_LE(tokens, sch.config().max_batch_tokens);
    for (Sequence* s : done) {
      auto owned = sch.finish(s);
      (*finished_len)[owned->result.id] = owned->len();
      if (preempted) {
        (*preempted)[owned->result.id] = owned->preemptions;
        before.erase(s);
      }
    }
    ++steps;
  }
  return steps;
}

TEST(Scheduler, ChunkedPrefillRespectsTokenBudget) {
  BlockAllocator blocks(64);
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 10;
  cfg.max_seqs = 4;
  cfg.block_size = 4;
  Scheduler sch(cfg, blocks);
  sch.add(seq("a", 25, 0));
  auto c1 = sch.schedule();
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0].len, 10);
  EXPECT_FALSE(c1[0].samples);
  c1[0].seq->computed = 10;
  auto c2 = sch.schedule();
  EXPECT_EQ(c2[0].start, 10);
  EXPECT_EQ(c2[0].len, 10);
  c2[0].seq->computed = 20;
  auto c3 = sch.schedule();
  EXPECT_EQ(c3[0].len, 5);
  EXPECT_TRUE(c3[0].samples);
}

// vLLM's prompt_logprobs: a sequence takes a logit row per prompt position, so its prefill goes
// in chunks whose rows, with every other sequence's, stay within the cap (max_seqs) a step (what the profile
// steps size the logits for); each prompt position is scored once, and every sequence finishes.
// --max-logit-rows raises the cap above max_seqs.
void check_prompt_logprob_rows(int64_t max_logit_rows) {
  BlockAllocator blocks(64);
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 64;
  cfg.max_seqs = 4;
  cfg.max_logit_rows = max_logit_rows;
  cfg.block_size = 4;
  Scheduler sch(cfg, blocks);
  const int64_t cap = max_logit_rows > 0 ? max_logit_rows : cfg.max_seqs;
  std::map<std::string, std::vector<int>> scored;  // id -> times each prompt position was scored
  for (int i = 0; i < 5; ++i) {
    auto s = seq("s" + std::to_string(i), 10 + 3 * i, i);
    if (i % 2 == 0) s->params.prompt_logprobs = i == 0 ? 0 : 2;
    scored[s->result.id].assign(static_cast<size_t>(s->prompt_len()), 0);
    sch.add(std::move(s));
  }
  int steps = 0, finished = 0, max_rows = 0;
  bool chunked = false;
  while (!sch.idle() && steps < 1000) {
    auto chunks = sch.schedule();
    ASSERT_FALSE(chunks.empty()) << "cap " << cap;
    int rows = 0;
    std::vector<Sequence*> done;
    for (auto& c : chunks) {
      // As the engine: a row per position to score, then the sampled row.
      const auto [from, to] = c.seq->positions_to_score(c.start, c.len);
      for (int64_t p = from; p < to; ++p) ++scored[c.seq->result.id][static_cast<size_t>(p)];
      rows += static_cast<int>(to - from) + (c.samples ? 1 : 0);
      chunked |= c.seq->params.scores_prompt() && !c.samples && c.start + c.len < c.seq->prompt_len();
      c.seq->scored = std::max(c.seq->scored, to);
      c.seq->computed = c.start + c.len;
      if (c.samples) {
        c.seq->tokens.push_back(1);
        c.seq->result.output_tokens.push_back(1);
        if (c.seq->result.output_tokens.size() == 3) done.push_back(c.seq);
      }
    }
    EXPECT_LE(rows, cap) << "step " << steps;
    max_rows = std::max(max_rows, rows);
    for (Sequence* s : done) {
      sch.finish(s);
      ++finished;
    }
    ++steps;
  }
  EXPECT_EQ(finished, 5);
  EXPECT_TRUE(chunked) << "the prompts' score rows should not fit one step";
  EXPECT_EQ(max_rows, cap);
  for (const auto& [id, times] : scored) {
    const bool scores = id == "s0" || id == "s2" || id == "s4";
    for (size_t p = 0; p < times.size(); ++p) {
      // Position p scores prompt token p + 1: every position but the last, once.
      const int want = scores && p + 1 < times.size() ? 1 : 0;
      EXPECT_EQ(times[p], want) << id << " position " << p;
    }
  }
}

TEST(Scheduler, PromptLogprobRowsStayWithinTheLogitRowCap) {
  check_prompt_logprob_rows(0);   // max_seqs
  check_prompt_logprob_rows(12);  // --max-logit-rows
}

TEST(Scheduler, DecodeFirstThenFifoAdmission) {
  BlockAllocator blocks(64);
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 8;
  cfg.max_seqs = 2;
  cfg.block_size = 4;
  Scheduler sch(cfg, blocks);
  sch.add(seq("a", 3, 0));
  sch.add(seq("b", 3, 1));
  sch.add(seq("c", 3, 2));
  auto c1 = sch.schedule();
  ASSERT_EQ(c1.size(), 2u);  // max_seqs
  EXPECT_EQ(c1[0].seq->result.id, "a");
  EXPECT_EQ(c1[1].seq->result.id, "b");
  EXPECT_EQ(sch.num_waiting(), 1u);
  std::map<std::string, int64_t> fin;
  for (auto& c : c1) {
    c.seq->computed = c.start + c.len;
    c.seq->tokens.push_back(1);
  }
  auto c2 = sch.schedule();
  ASSERT_EQ(c2.size(), 2u);
  EXPECT_EQ(c2[0].len, 1);  // decode tokens
  EXPECT_EQ(c2[1].len, 1);
}

TEST(Scheduler, PreemptsNewestWhenCacheRunsOutAndEveryoneFinishes) {
  BlockAllocator blocks(10);  // 40 tokens of cache
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 64;
  cfg.max_seqs = 8;
  cfg.block_size = 4;
  Scheduler sch(cfg, blocks);
  for (int i = 0; i < 6; ++i) sch.add(seq(std::string("s").append(std::to_string(i)), 5, i));
  std::map<std::string, int64_t> fin, preempted;
  drive(sch, /*out=*/12, &fin, 10000, &preempted);
  EXPECT_TRUE(sch.idle());
  ASSERT_EQ(fin.size(), 6u);
  for (auto& [id, len] : fin) EXPECT_EQ(len, 17) << id;
  EXPECT_GT(sch.preemptions(), 0);
  // The newest give way: the oldest is never preempted, and every preemption is a later arrival's.
  int64_t total = 0;
  for (auto& [id, n] : preempted) total += n;
  EXPECT_EQ(total, sch.preemptions());
  EXPECT_EQ(preempted["s0"], 0);
  EXPECT_GT(preempted["s3"] + preempted["s4"] + preempted["s5"], 0);
  EXPECT_EQ(blocks.num_free(), 10);
}

TEST(Scheduler, RejectsSequenceLargerThanCache) {
  BlockAllocator blocks(2);
  SchedulerConfig cfg;
  cfg.block_size = 4;
  Scheduler sch(cfg, blocks);
  EXPECT_THROW(sch.add(seq("big", 9, 0)), std::exception);
}

TEST(BlockAllocator, AllOrNothing) {
  BlockAllocator a(3);
  std::vector<int32_t> t;
  EXPECT_FALSE(a.allocate(4, &t));
  EXPECT_TRUE(t.empty());
  EXPECT_TRUE(a.allocate(3, &t));
  EXPECT_EQ(a.num_free(), 0);
  a.release(&t);
  EXPECT_EQ(a.num_free(), 3);
}

}  // namespace
}  // namespace shardlm
