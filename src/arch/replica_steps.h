// Running one replica over several ranks: the leader (stage 0, tp 0) schedules and samples; every
// step it broadcasts the step's batch to the other ranks of the replica, and all of them run their
// shard of it. Scheduling is decided once per replica, so every rank runs the same batch.
#pragma once

#include "arch/model.h"

namespace shardlm {

class Communicator;

// On the leader: a Model whose forward() first broadcasts the batch to the replica.
class BroadcastingModel final : public Model {
 public:
  BroadcastingModel(Model& inner, Communicator& replica) : inner_(inner), replica_(replica) {}
  // Tells the other ranks there are no more steps (idempotent; also done by the destructor).
  void finish();
  ~BroadcastingModel() override;

  const ModelSpec& spec() const override { return inner_.spec(); }
  const ShardPlan& shard() const override { return inner_.shard(); }
  int32_t allocate_kv_cache(int64_t budget_bytes, int64_t block_size, int64_t max_blocks) override {
    return inner_.allocate_kv_cache(budget_bytes, block_size, max_blocks);
  }
  void forward(const ForwardBatch& batch, float* logits) override;
  size_t load_bytes() const override { return inner_.load_bytes(); }
  double load_seconds() const override { return inner_.load_seconds(); }

 private:
  Model& inner_;
  Communicator& replica_;
  bool finished_ = false;
};

// On every other rank of the replica: allocates the KV cache (with the leader's arguments) and runs
// the steps the leader broadcasts until it finishes.
void serve_replica_steps(Model& model, Communicator& replica, int64_t kv_budget_bytes, int64_t block_size,
                         int64_t max_blocks);

}  // namespace shardlm
