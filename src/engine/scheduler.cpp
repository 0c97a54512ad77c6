#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockAllocator& blocks) : cfg_(cfg), blocks_(blocks) {
  SHARDLM_CHECK(cfg.max_batch_tokens > 0, "--max-batch-tokens must be positive");
  SHARDLM_CHECK(cfg.max_seqs > 0, "--max-seqs must be positive");
  SHARDLM_CHECK(cfg.max_logit_rows >= 0, "--max-logit-rows must be >= 0");
  SHARDLM_CHECK(cfg.block_size > 0, "KV block size must be positive");
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  SHARDLM_CHECK(seq->len() > 0, "sequence " << seq->result.id << " has no tokens");
  SHARDLM_CHECK(blocks_for(seq->len() + 1) <= blocks_.num_blocks(),
                "sequence " << seq->result.id << " of " << seq->len() << " tokens cannot fit the KV cache of "
                            << capacity_tokens() << " tokens");
  waiting_.push_back(std::move(seq));
}

void Scheduler::preempt(size_t i) {
  std::unique_ptr<Sequence> s = std::move(running_[i]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  blocks_.release(&s->blocks);
  s->computed = 0;
  ++s->preemptions;
  ++preemptions_;
  waiting_.push_front(std::move(s));
}

int64_t Scheduler::fit_rows(const Sequence& s, int64_t start, int64_t n, int64_t allowance) {
  const auto [from, to] = s.positions_to_score(start, n);
  if (rows_of(s, start, n) <= allowance) return n;
  // Cut at a score row: the chunk then ends before the prompt's last token, so it samples nothing,
  // and it keeps at least one row so the prefill goes on.
  const int64_t scores = std::min(to - from, std::max<int64_t>(1, allowance));
  return from + scores - start;
}

int64_t Scheduler::rows_of(const Sequence& s, int64_t start, int64_t n) {
  const auto [from, to] = s.positions_to_score(start, n);
  return (to - from) + (start + n == s.len() ? 1 : 0);
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> out;
  int64_t budget = cfg_.max_batch_tokens;
  // Logit rows: one per sampling sequence, and the score rows of prompt logprobs, within
  // logit_rows() a step (what the profile steps size the logits for); every running sequence keeps
  // one.
  int64_t rows_left = cfg_.logit_rows();
  bool preempted = false;
  // 1. Running sequences, oldest first, so that the newest are the ones preempted.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i].get();
    int64_t n = std::min(s->len() - s->computed, budget);
    int64_t extra = blocks_for(s->computed + n) - static_cast<int64_t>(s->blocks.size());
    while (extra > blocks_.num_free() && running_.size() > i + 1) {
      preempt(running_.size() - 1);  // the newest, not yet scheduled this step
      preempted = true;
    }
    if (extra > blocks_.num_free()) {
      // Alone and still short: take what fits in the blocks it has plus the free ones.
      const int64_t room = (static_cast<int64_t>(s->blocks.size()) + blocks_.num_free()) * cfg_.block_size - s->computed;
      n = std::min(n, room);
      if (n <= 0) {
        preempt(i);
        preempted = true;
        continue;
      }
      extra = blocks_for(s->computed + n) - static_cast<int64_t>(s->blocks.size());
    }
    SHARDLM_CHECK(blocks_.allocate(static_cast<int32_t>(extra), &s->blocks), "KV block accounting is inconsistent");
    // Fewer tokens need no more blocks than allocated.
    n = fit_rows(*s, s->computed, n, rows_left - static_cast<int64_t>(running_.size() - i - 1));
    rows_left -= rows_of(*s, s->computed, n);
    out.push_back({s, s->computed, n, s->computed + n == s->len()});
    budget -= n;
    ++i;
  }
  // 2. Admit waiting sequences in FIFO order, each with blocks for all its current tokens, so an
  // admitted prefill never stalls half way. Not in a step that had to preempt: memory is short.
  while (!preempted && budget > 0 && rows_left > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < cfg_.max_seqs) {
    Sequence* s = waiting_.front().get();
    const int64_t need = blocks_for(s->len());
    if (need > blocks_.num_free()) break;
    SHARDLM_CHECK(blocks_.allocate(static_cast<int32_t>(need), &s->blocks), "KV block accounting is inconsistent");
    const int64_t n = fit_rows(*s, 0, std::min(s->len(), budget), rows_left);
    rows_left -= rows_of(*s, 0, n);
    out.push_back({s, 0, n, n == s->len()});
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return out;
}

std::unique_ptr<Sequence> Scheduler::finish(Sequence* seq) {
  auto it = std::find_if(running_.begin(), running_.end(), [seq](const auto& p) { return p.get() == seq; });
  SHARDLM_CHECK(it != running_.end(), "finishing a sequence that is not running");
  std::unique_ptr<Sequence> s = std::move(*it);
  running_.erase(it);
  blocks_.release(&s->blocks);
  return s;
}

}  // namespace shardlm
