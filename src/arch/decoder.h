// Pre-norm decoder: embedding, layers of (RMSNorm, attention block, RMSNorm, feed-forward block)
// on a residual stream, final RMSNorm and LM head. The blocks (arch/layer_blocks.h) make it Llama,
// Mistral, Qwen2/3 (GQA + SwiGLU), Mixtral and Qwen-MoE (GQA + MoE) or DeepSeek-V3 / Kimi K2
// (MLA + MoE with dense first layers). Sharded by tensor, pipeline and expert parallelism.
#pragma once

#include <memory>

#include "arch/model.h"

namespace shardlm {

std::unique_ptr<Model> build_decoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend,
                                     const ShardPlan& plan, const ShardComms& comms);

}  // namespace shardlm
