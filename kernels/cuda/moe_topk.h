// MoE routing on the device: router logits [T, E] (fp32) -> the k chosen experts [T, k] (int32,
// best first) and their weights [T, k] (fp32). Same semantics, the same ids in the same order, as
// the host router src/arch/moe_router.h (softmax top-k, or sigmoid with selection bias and
// group-limited top-k; ties to the lower index; NaN never selected; sums in fp64 in the host's
// order). The only difference from the host is the exponential: the device evaluates it in fp64
// and rounds to fp32, the host calls expf; they can differ by one ulp (weights within ~1e-7
// relative), which changes the chosen ids only for probabilities within one ulp of each other.
//
// One thread block per token; shared memory (3 E + k + 2 n_group) * 4 bytes. Preconditions (the
// host router checks them, these launchers do not): 0 < k <= E; for the sigmoid mode n_group
// divides E, 1 <= topk_group <= n_group and k <= topk_group * E / n_group.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::cuda {

// p = softmax(logits row); the k largest p; renormalise: divide by their sum; then times scale.
void launch_moe_topk_softmax(const float* logits, int64_t T, int E, int k, bool renormalise, double scale,
                             int32_t* ids, float* weights, cudaStream_t stream);

// s = sigmoid(logits row); selection by s + bias (bias [E] may be null) within the topk_group best
// of n_group groups (a group scores the sum of its two best); weights from s, divided by their sum
// (+ 1e-20) when norm_topk_prob, then times routed_scaling_factor.
void launch_moe_topk_sigmoid(const float* logits, int64_t T, int E, int k, const float* bias, int n_group,
                             int topk_group, bool norm_topk_prob, double routed_scaling_factor, int32_t* ids,
                             float* weights, cudaStream_t stream);

}  // namespace shardlm::cuda
