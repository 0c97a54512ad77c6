// The profiling pass before the KV cache is sized (vLLM's profile run): every rank runs the
// largest steps its scheduler can issue on a small throwaway cache, so that every buffer a step
// grows (activation scratch, GEMM and attention workspaces, the sampler's rows x vocab, NCCL's
// lazily made channels) has its peak size when the free device memory is read. The cache then
// takes a share of what is left, and no later step has to find memory the cache already holds.
#pragma once

#include <cstdint>

#include "arch/model.h"
#include "engine/scheduler.h"

namespace shardlm {

// The two profile steps, on a cache of `blocks` blocks numbered from 0.
//  - peak: the most tokens a step holds (--max-batch-tokens, at most max-seqs sequences of the
//    context limit each), as prefill chunks from position 0 plus one decode token for each other
//    sequence it may run, at the last block's first position of the context (so the attention's
//    split buffers are sized for the longest context), every sequence's last token sampled, and
//    more of its prefill tokens where --max-logit-rows allows more rows than sequences;
//  - decode: a decode token for each sequence a step may run, at that same position.
// A decode token's earlier blocks are all the first chunk's first block, which the peak step fills
// (a position no token wrote may hold anything, NaN included); its own position is in a block of
// its own. Both steps are sampled with top-k, top-p and min-p on, the sampler's longest path, and
// a top alternative a row (so those arrays exist).
struct ProfileSteps {
  ForwardBatch peak;
  ForwardBatch decode;
  int32_t blocks = 0;
};
// max_len: the context limit (context_limit: --max-model-len, or max_position_embeddings); stages:
// pipeline stages, each of whose micro-batches takes its share of the sequence cap (as Engine's schedulers do).
ProfileSteps make_profile_steps(const SchedulerConfig& cfg, int64_t max_len, int64_t vocab, int stages = 1);

struct ProfileResult {
  int64_t tokens = 0;       // in the peak step
  int64_t grew_bytes = -1;  // device memory the steps left allocated (free before - free after); -1 unknown
};

// Runs both steps on every rank of the replica (collective over its groups: each rank calls it at
// the same point, `leader` on the replica leader, which ends the steps as the engine does), then
// frees the throwaway cache. The backend's own buffers keep the size the steps gave them.
ProfileResult run_profile_steps(Model& model, ComputeBackend& backend, bool leader, const SchedulerConfig& cfg,
                                DType kv_dtype);

}  // namespace shardlm
