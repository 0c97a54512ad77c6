// Dense pre-norm decoder (Llama, Mistral, Qwen2, Qwen3): GQA attention with RoPE, optional q/k/v
// bias, optional per-head QK RMSNorm, optional sliding window; SwiGLU MLP; RMSNorm; tied or
// untied LM head.
#pragma once

#include <memory>

#include "arch/model.h"

namespace shardlm {

std::unique_ptr<Model> build_dense_decoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend,
                                           const ShardPlan& plan, const ShardComms& comms);

}  // namespace shardlm
