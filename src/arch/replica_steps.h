// Running one replica over several ranks: the leader (stage 0, tp 0) schedules and samples; every
// step it sends the step's batch to the other ranks of the replica, and all of them run their
// shard of it. Scheduling is decided once per replica, so every rank runs the same batch.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "arch/model.h"
#include "parallel/communicator.h"

namespace shardlm {

class Communicator;
class CommRequest;

// On the leader: a Model whose forward() first broadcasts the batch to the replica.
class BroadcastingModel final : public Model {
 public:
  BroadcastingModel(Model& inner, Communicator& replica) : inner_(inner), replica_(replica) {}
  // Tells the other ranks there are no more steps (idempotent; also done by the destructor).
  void finish();
  ~BroadcastingModel() override;

  const ModelSpec& spec() const override { return inner_.spec(); }
  const ShardPlan& shard() const override { return inner_.shard(); }
  int32_t allocate_kv_cache(int64_t budget_bytes, int64_t block_size, int64_t max_blocks,
                            DType dtype = DType::F32) override {
    return inner_.allocate_kv_cache(budget_bytes, block_size, max_blocks, dtype);
  }
  int64_t kv_blocks_fitting(int64_t budget_bytes, int64_t block_size, DType dtype) const override {
    return inner_.kv_blocks_fitting(budget_bytes, block_size, dtype);
  }
  void release_kv_cache() override { inner_.release_kv_cache(); }
  void record_kv_magnitudes() override { inner_.record_kv_magnitudes(); }
  std::vector<float> kv_magnitudes() const override { return inner_.kv_magnitudes(); }
  void forward(const ForwardBatch& batch, float* logits) override;
  int max_steps_in_flight() const override { return inner_.max_steps_in_flight(); }
  void begin_step(const ForwardBatch& batch) override;
  void end_step(float* logits) override { inner_.end_step(logits); }
  // Ending a step sends nothing (the replica's ranks got the step, sample rows included, in
  // begin_step): the inner model ends it, with the choices made where the logits ended.
  void end_step_sampled(StepChoices* out) override { inner_.end_step_sampled(out); }
  bool runs_empty_steps() const override { return inner_.runs_empty_steps(); }
  const MoeStepStats* last_step_moe() const override { return inner_.last_step_moe(); }
  const std::vector<StageSeconds>* last_step_stages() const override { return inner_.last_step_stages(); }
  size_t load_bytes() const override { return inner_.load_bytes(); }
  double load_seconds() const override { return inner_.load_seconds(); }

 private:
  // Sends the step (or, with last, the end of the steps) to every other rank of the replica.
  void send_step(const ForwardBatch& batch, bool last = false);

  // A step's messages, kept until their sends complete.
  struct Outgoing {
    std::vector<int64_t> header;
    std::vector<int32_t> ints;
    std::vector<int64_t> slots;
    std::vector<SampleRow> sample_rows;
    std::vector<TokenEdit> token_edits;
    std::vector<std::unique_ptr<CommRequest>> requests;
  };

  Model& inner_;
  Communicator& replica_;
  std::deque<Outgoing> pending_;
  bool finished_ = false;
};

// On every other rank of the replica: allocates the KV cache (with the leader's arguments) and runs
// the steps the leader broadcasts until it finishes.
void serve_replica_steps(Model& model, Communicator& replica, int64_t kv_budget_bytes, int64_t block_size,
                         int64_t max_blocks, DType kv_dtype);

}  // namespace shardlm
