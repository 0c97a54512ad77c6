#include "arch/replica_steps.h"

#include <cstring>
#include <exception>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

// Header of a broadcast step; num_tokens < 0 means "no more steps".
struct StepHeader {
  int64_t num_tokens = 0;
  int64_t seq_starts = 0;
  int64_t blocks = 0;
  int64_t logit_rows = 0;
};

void broadcast_step(Communicator& c, ForwardBatch& b, StepHeader& h) {
  c.broadcast(&h, sizeof h / sizeof(int64_t), CommDType::kI64, 0);
  if (h.num_tokens <= 0) return;
  const size_t T = static_cast<size_t>(h.num_tokens);
  b.tokens.resize(T);
  b.positions.resize(T);
  b.slots.resize(T);
  b.token_seq.resize(T);
  b.seq_block_start.resize(static_cast<size_t>(h.seq_starts));
  b.blocks.resize(static_cast<size_t>(h.blocks));
  b.logit_rows.resize(static_cast<size_t>(h.logit_rows));
  // The int32 arrays travel as one message, the slots as another.
  std::vector<int32_t> blob;
  std::vector<int32_t>* parts[] = {&b.tokens, &b.positions, &b.token_seq, &b.seq_block_start, &b.blocks, &b.logit_rows};
  if (c.rank() == 0) {
    for (auto* p : parts) blob.insert(blob.end(), p->begin(), p->end());
  } else {
    size_t n = 0;
    for (auto* p : parts) n += p->size();
    blob.resize(n);
  }
  c.broadcast(blob.data(), blob.size(), CommDType::kI32, 0);
  if (c.rank() != 0) {
    size_t at = 0;
    for (auto* p : parts) {
      std::memcpy(p->data(), blob.data() + at, p->size() * sizeof(int32_t));
      at += p->size();
    }
  }
  c.broadcast(b.slots.data(), T, CommDType::kI64, 0);
}

}  // namespace

void BroadcastingModel::forward(const ForwardBatch& batch, float* logits) {
  StepHeader h{batch.num_tokens(), static_cast<int64_t>(batch.seq_block_start.size()),
               static_cast<int64_t>(batch.blocks.size()), static_cast<int64_t>(batch.logit_rows.size())};
  broadcast_step(replica_, const_cast<ForwardBatch&>(batch), h);  // root only reads the batch
  inner_.forward(batch, logits);
}

void BroadcastingModel::finish() {
  if (finished_) return;
  finished_ = true;
  StepHeader h{-1, 0, 0, 0};
  ForwardBatch none;
  broadcast_step(replica_, none, h);
}

BroadcastingModel::~BroadcastingModel() {
  // An exception unwinding past here aborts the job anyway; only finish on the normal path.
  if (!finished_ && std::uncaught_exceptions() == 0) finish();
}

void serve_replica_steps(Model& model, Communicator& replica, int64_t kv_budget_bytes, int64_t block_size,
                         int64_t max_blocks) {
  model.allocate_kv_cache(kv_budget_bytes, block_size, max_blocks);
  ForwardBatch batch;
  for (;;) {
    StepHeader h;
    broadcast_step(replica, batch, h);
    if (h.num_tokens < 0) return;
    if (h.num_tokens > 0) model.forward(batch, nullptr);
  }
}

}  // namespace shardlm
