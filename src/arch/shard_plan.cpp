#include "arch/shard_plan.h"

#include "core/error.h"
#include "model/model_spec.h"

namespace shardlm {

ShardPlan ShardPlan::make(const ModelSpec& spec, int tp_rank, int tp_size, int stage, int stages, int64_t first_layer,
                          int64_t last_layer) {
  ShardPlan p;
  p.tp_rank = tp_rank;
  p.tp_size = tp_size;
  p.stage = stage;
  p.stages = stages;
  p.first_layer = first_layer;
  p.last_layer = last_layer < 0 ? spec.num_layers : last_layer;
  SHARDLM_CHECK(spec.num_heads % tp_size == 0 && spec.intermediate_size % tp_size == 0 && spec.vocab_size % tp_size == 0,
                "tp " << tp_size << " does not divide the heads, intermediate size or vocabulary");
  p.q_heads = spec.num_heads / tp_size;
  p.q_head0 = tp_rank * p.q_heads;
  if (spec.num_kv_heads % tp_size == 0) {
    p.kv_heads = spec.num_kv_heads / tp_size;
    p.kv_head0 = tp_rank * p.kv_heads;
  } else {
    // More ranks than KV heads: each rank keeps the one KV head its query heads use (replicated).
    SHARDLM_CHECK(tp_size % spec.num_kv_heads == 0, "tp " << tp_size << " and " << spec.num_kv_heads
                                                          << " KV heads: one must divide the other");
    p.kv_heads = 1;
    p.kv_head0 = p.q_head0 / (spec.num_heads / spec.num_kv_heads);
  }
  p.inter = spec.intermediate_size / tp_size;
  p.inter0 = tp_rank * p.inter;
  p.vocab = spec.vocab_size / tp_size;
  p.vocab0 = tp_rank * p.vocab;
  // Experts split over tp (ep 1) where tp divides them; else set_expert_parallel with ep > 1, which
  // keeps experts whole, must follow (cmd_run), or with ep 1 says why it cannot.
  if (!spec.moe.enabled() || spec.moe.expert_intermediate % tp_size == 0) p.set_expert_parallel(spec, 0, 1);
  return p;
}

void ShardPlan::set_expert_parallel(const ModelSpec& spec, int rank, int size) {
  ep_rank = rank;
  ep_size = size;
  const MoeSpec& m = spec.moe;
  if (!m.enabled()) return;
  SHARDLM_CHECK(size >= 1 && m.num_experts % size == 0,
                "ep " << size << " does not divide the " << m.num_experts << " routed experts");
  if (size == 1) {
    SHARDLM_CHECK(m.expert_intermediate % tp_size == 0, "tp " << tp_size << " does not divide the expert intermediate size "
                                                              << m.expert_intermediate);
    experts = m.num_experts;
    expert0 = 0;
    expert_inter = m.expert_intermediate / tp_size;
    expert_inter0 = tp_rank * expert_inter;
  } else {
    experts = m.num_experts / size;
    expert0 = static_cast<int64_t>(rank) * experts;
    expert_inter = m.expert_intermediate;
    expert_inter0 = 0;
  }
  SHARDLM_CHECK(m.shared_intermediate % tp_size == 0,
                "tp " << tp_size << " does not divide the shared expert intermediate size " << m.shared_intermediate);
  shared_inter = m.shared_intermediate / tp_size;
  shared_inter0 = tp_rank * shared_inter;
}

}  // namespace shardlm
