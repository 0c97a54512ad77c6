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
  return p;
}

}  // namespace shardlm
