#include "arch/replica_steps.h"

#include <cstring>
#include <exception>
#include <type_traits>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

constexpr int kTagStepHeader = 21, kTagStepInts = 22, kTagStepSlots = 23, kTagStepSampleRows = 24,
              kTagStepTokenEdits = 25;
// Steps whose sends may still be in progress; older ones are completed before their buffers go.
constexpr size_t kMaxPendingSteps = 8;
constexpr size_t kEditWords = 4;

// Header of a step message; num_tokens < 0 means "no more steps".
struct StepHeader {
  int64_t num_tokens = 0;
  int64_t seq_starts = 0;
  int64_t blocks = 0;
  int64_t logit_rows = 0;
  int64_t sample_rows = 0;  // 0 or logit_rows: the last stage samples the step (ForwardBatch::sample_rows)
  int64_t token_edits = 0;  // what its rows' logit controls and penalties read (ForwardBatch::token_edits)
};
static_assert(std::is_trivially_copyable_v<SampleRow>, "sample rows travel as bytes");
static_assert(std::is_trivially_copyable_v<TokenEdit> && sizeof(TokenEdit) == kEditWords * sizeof(int32_t),
              "token edits travel as 32-bit words");

std::vector<int32_t>* int_parts(ForwardBatch& b, size_t i) {
  std::vector<int32_t>* parts[] = {&b.tokens, &b.positions, &b.token_seq, &b.seq_block_start, &b.blocks, &b.logit_rows};
  return parts[i];
}
constexpr size_t kIntParts = 6;

}  // namespace

// The step travels as point-to-point messages that the leader does not wait for: a collective
// broadcast would hold the leader until every rank of the replica had finished its previous step,
// and the pipeline stages would never overlap.
void BroadcastingModel::send_step(const ForwardBatch& batch_in, bool last) {
  ForwardBatch& batch = const_cast<ForwardBatch&>(batch_in);  // only read
  while (pending_.size() >= kMaxPendingSteps) {
    for (auto& r : pending_.front().requests) r->wait();
    pending_.pop_front();
  }
  Outgoing& o = pending_.emplace_back();
  batch.sampled();
  o.header = {last ? -1 : batch.num_tokens(),
              static_cast<int64_t>(batch.seq_block_start.size()),
              static_cast<int64_t>(batch.blocks.size()),
              static_cast<int64_t>(batch.logit_rows.size()),
              static_cast<int64_t>(batch.sample_rows.size()),
              static_cast<int64_t>(batch.token_edits.size())};
  for (size_t i = 0; i < kIntParts; ++i) {
    const auto* p = int_parts(batch, i);
    o.ints.insert(o.ints.end(), p->begin(), p->end());
  }
  o.slots = batch.slots;
  o.sample_rows = batch.sample_rows;
  o.token_edits = batch.token_edits;
  for (int r = 1; r < replica_.size(); ++r) {
    o.requests.push_back(replica_.isend(o.header.data(), o.header.size(), CommDType::kI64, r, kTagStepHeader));
    if (batch.num_tokens() <= 0) continue;
    o.requests.push_back(replica_.isend(o.ints.data(), o.ints.size(), CommDType::kI32, r, kTagStepInts));
    o.requests.push_back(replica_.isend(o.slots.data(), o.slots.size(), CommDType::kI64, r, kTagStepSlots));
    if (!o.sample_rows.empty()) {
      o.requests.push_back(replica_.isend(o.sample_rows.data(), o.sample_rows.size() * sizeof(SampleRow),
                                          CommDType::kU8, r, kTagStepSampleRows));
    }
    if (!o.token_edits.empty()) {
      o.requests.push_back(replica_.isend(o.token_edits.data(), kEditWords * o.token_edits.size(), CommDType::kI32, r,
                                          kTagStepTokenEdits));
    }
  }
}

void BroadcastingModel::forward(const ForwardBatch& batch, float* logits) {
  send_step(batch);
  inner_.forward(batch, logits);
}

void BroadcastingModel::begin_step(const ForwardBatch& batch) {
  send_step(batch);
  inner_.begin_step(batch);
}

void BroadcastingModel::finish() {
  if (finished_) return;
  finished_ = true;
  ForwardBatch none;
  none.clear();
  send_step(none, /*last=*/true);
  for (auto& o : pending_) {
    for (auto& r : o.requests) r->wait();
  }
  pending_.clear();
}

BroadcastingModel::~BroadcastingModel() {
  // An exception unwinding past here aborts the job anyway; only finish on the normal path.
  if (!finished_ && std::uncaught_exceptions() == 0) finish();
}

void serve_replica_steps(Model& model, Communicator& replica, int64_t kv_budget_bytes, int64_t block_size,
                         int64_t max_blocks, DType kv_dtype) {
  model.allocate_kv_cache(kv_budget_bytes, block_size, max_blocks, kv_dtype);
  ForwardBatch batch;
  std::vector<int32_t> ints;
  for (;;) {
    StepHeader h;
    replica.recv(&h, sizeof h / sizeof(int64_t), CommDType::kI64, 0, kTagStepHeader);
    if (h.num_tokens < 0) return;
    if (h.num_tokens == 0) {
      // An empty step still runs where expert-parallel groups pair their all-to-alls step by step.
      if (model.runs_empty_steps()) {
        batch.clear();
        model.forward(batch, nullptr);
      }
      continue;
    }
    const size_t T = static_cast<size_t>(h.num_tokens);
    const size_t sizes[kIntParts] = {T, T, T, static_cast<size_t>(h.seq_starts), static_cast<size_t>(h.blocks),
                                     static_cast<size_t>(h.logit_rows)};
    size_t total = 0;
    for (size_t s : sizes) total += s;
    ints.resize(total);
    batch.slots.resize(T);
    replica.recv(ints.data(), ints.size(), CommDType::kI32, 0, kTagStepInts);
    replica.recv(batch.slots.data(), T, CommDType::kI64, 0, kTagStepSlots);
    batch.sample_rows.resize(static_cast<size_t>(h.sample_rows));
    if (h.sample_rows > 0) {
      replica.recv(batch.sample_rows.data(), batch.sample_rows.size() * sizeof(SampleRow), CommDType::kU8, 0,
                   kTagStepSampleRows);
    }
    batch.token_edits.resize(static_cast<size_t>(h.token_edits));
    if (h.token_edits > 0) {
      replica.recv(batch.token_edits.data(), kEditWords * batch.token_edits.size(), CommDType::kI32, 0,
                   kTagStepTokenEdits);
    }
    size_t at = 0;
    for (size_t i = 0; i < kIntParts; ++i) {
      auto* p = int_parts(batch, i);
      p->assign(ints.begin() + static_cast<std::ptrdiff_t>(at), ints.begin() + static_cast<std::ptrdiff_t>(at + sizes[i]));
      at += sizes[i];
    }
    model.forward(batch, nullptr);
  }
}

}  // namespace shardlm
