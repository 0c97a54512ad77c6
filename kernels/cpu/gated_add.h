// The shared-expert epilogue of a MoE layer: out [T, H] += g_t * y [T, H], with the per-token gate
// g_t = 1 / (1 + exp(-gate_logits[t])) in fp32 (Qwen2-MoE's sigmoid-gated shared expert), or
// g_t = 1 when gate_logits is null (DeepSeek's shared experts).
#pragma once

#include <cstdint>

namespace shardlm::cpu {

void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H);

}  // namespace shardlm::cpu
