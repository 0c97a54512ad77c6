// One GPU per rank: the ranks of a node take the node's GPUs round-robin by local rank. Called
// once per process, before any device memory or communicator is made.
#pragma once

#include "parallel/node_local.h"

namespace shardlm {

// cudaSetDevice(local_rank % device_count) and returns that device; -1 (and nothing done) where
// there is no GPU or the build has no CUDA. Throws Error when cudaSetDevice fails.
int bind_local_gpu(const NodeLocal& node);

// Makes bind_local_gpu call `binder` from now on: how a program over the emulated CUDA runtime
// (src/parallel/emulated_nccl_hook.cpp) binds its ranks to emulated GPUs by the same rule.
void override_gpu_binding(int (*binder)(const NodeLocal& node));

}  // namespace shardlm
