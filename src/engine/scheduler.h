// Continuous batching over a paged KV cache.
//
// Each step: every running sequence gets its next chunk (one token when decoding, up to the
// remaining budget while prefilling) in admission order; then waiting sequences are admitted in
// FIFO order while the token budget, the sequence cap and free KV blocks allow. When the cache runs
// out, the most recently admitted sequences are preempted: their blocks are freed and they go back
// to the head of the queue to be recomputed later (which, with batch-invariant kernels and
// position-keyed sampling, reproduces the same tokens). A step has at most logit_rows() logit rows:
// a sequence with prompt logprobs, which takes one per prompt position, prefills in chunks that fit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/block_allocator.h"
#include "engine/sequence.h"

namespace shardlm {

struct SchedulerConfig {
  int64_t max_batch_tokens = 2048;  // tokens per step, prefill chunks included
  int64_t max_seqs = 64;            // sequences running at once
  // Logit rows a step may carry (a sampling sequence's one, a prompt-logprobs sequence's one per
  // prompt position); 0: max_seqs. What the profile steps size the logits and sampling buffers for.
  int64_t max_logit_rows = 0;
  int64_t logit_rows() const { return max_logit_rows > 0 ? std::max(max_logit_rows, max_seqs) : max_seqs; }
  int64_t block_size = 16;          // tokens per KV block
  // The context limit (prompt and output tokens of one sequence), --max-model-len; 0: the model's
  // max_position_embeddings, or what the KV cache holds where that is less.
  int64_t max_model_len = 0;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;  // first token index computed in this step
  int64_t len = 0;
  bool samples = false;  // the chunk ends at the sequence's last token: a new token is sampled
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockAllocator& blocks);

  // Largest sequence the cache could ever hold (tokens).
  int64_t capacity_tokens() const { return static_cast<int64_t>(blocks_.num_blocks()) * cfg_.block_size; }
  void add(std::unique_ptr<Sequence> seq);
  // Plans the next step; allocates the blocks it needs. Empty when nothing can run.
  std::vector<ScheduledChunk> schedule();
  // Removes a running sequence, releasing its blocks.
  std::unique_ptr<Sequence> finish(Sequence* seq);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t preemptions() const { return preemptions_; }
  const SchedulerConfig& config() const { return cfg_; }
  int32_t blocks_used() const { return blocks_.num_used(); }

 private:
  int64_t blocks_for(int64_t tokens) const { return (tokens + cfg_.block_size - 1) / cfg_.block_size; }
  void preempt(size_t running_index);
  // The chunk length, at most n, from `start` whose logit rows fit `allowance` (>= 1): a sequence
  // with prompt logprobs takes a row per prompt position.
  static int64_t fit_rows(const Sequence& s, int64_t start, int64_t n, int64_t allowance);
  static int64_t rows_of(const Sequence& s, int64_t start, int64_t n);  // the chunk's logit rows

  SchedulerConfig cfg_;
  BlockAllocator& blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  int64_t preemptions_ = 0;
};

}  // namespace shardlm
