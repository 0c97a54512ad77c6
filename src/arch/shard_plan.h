// ShardPlan: which part of the model this rank holds. Tensor parallelism splits attention heads
// (KV heads split, or replicated when tp exceeds them), MLP columns/rows and the vocabulary;
// pipeline parallelism gives each stage a contiguous range of layers.
#pragma once

#include <cstdint>

namespace shardlm {

struct ModelSpec;
class Communicator;

struct ShardPlan {
  int tp_rank = 0, tp_size = 1;
  int stage = 0, stages = 1;
  int64_t first_layer = 0, last_layer = -1;  // [first, last); -1: all layers
  // Local slices, filled by make(): [start, start + count).
  int64_t q_head0 = 0, q_heads = 0;
  int64_t kv_head0 = 0, kv_heads = 0;
  int64_t inter0 = 0, inter = 0;
  int64_t vocab0 = 0, vocab = 0;
  // Mixture-of-Experts. With ep_size 1 every rank holds every routed expert, each split over tp
  // like the dense MLP; with ep_size > 1 (the dp x tp ranks of the stage) each rank holds whole
  // experts [expert0, expert0 + experts) and tokens travel to them by all-to-all.
  int ep_rank = 0, ep_size = 1;
  int64_t expert0 = 0, experts = 0;
  int64_t expert_inter0 = 0, expert_inter = 0;  // slice of each local routed expert's intermediate
  int64_t shared_inter0 = 0, shared_inter = 0;  // slice of the shared experts' intermediate (tp)

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
  // The whole model on one rank when called with the defaults.
  static ShardPlan make(const ModelSpec& spec, int tp_rank = 0, int tp_size = 1, int stage = 0, int stages = 1,
                        int64_t first_layer = 0, int64_t last_layer = -1);
  // Spreads the routed experts over an expert-parallel group of ep_size ranks (this rank is
  // ep_rank); ep_size 1 keeps the tp split. Throws unless ep_size divides the expert count.
  void set_expert_parallel(const ModelSpec& spec, int ep_rank, int ep_size);
};

// The groups a shard talks over; null when the group has one rank.
struct ShardComms {
  Communicator* tp = nullptr;       // this stage's tensor-parallel ranks
  Communicator* pp = nullptr;       // this tp index's ranks of every stage (group rank = stage)
  Communicator* replica = nullptr;  // every rank of the replica (group rank 0 = leader)
  Communicator* ep = nullptr;       // expert-parallel: the dp x tp ranks of this stage
};

}  // namespace shardlm
