// The attention op at decode on long contexts, for shardlm bench: microseconds per call and the
// rate the K/V cache is read at, beside the memory bandwidth (decode attention reads every cached
// row once per step, so the bandwidth is its ceiling).
#pragma once

#include "compute/backend.h"
#include "model/model_spec.h"

namespace shardlm {

// Times b.attention for a few (sequences x cached positions) at the model's head shape, with a
// cache of random rows in backend memory. On CUDA each is timed twice: as the backend launches it
// (split along the positions when the step is short of work) and forced unsplit (no bound on the
// positions), so one run shows what the split gains. Prints nothing for an MLA model.
void print_attention_bench(ComputeBackend& b, const ModelSpec& spec, double bw_gbs);

}  // namespace shardlm
