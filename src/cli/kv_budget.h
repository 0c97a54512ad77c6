// The KV cache budget of a rank, for shardlm run and shardlm bench: --kv-cache-gb as GiB, or auto:
// on a device a share of the memory free once the weights are loaded (TensorRT-LLM's
// kv_cache_free_gpu_mem_fraction: no profiling pass; what is left holds the activations, which
// grow with the first large steps, and NCCL's buffers), divided among the ranks sharing the device;
// on the CPU 4 GiB.
#pragma once

#include <cstdint>
#include <string>

#include "compute/backend.h"
#include "parallel/communicator.h"
#include "parallel/node_local.h"

namespace shardlm {

struct KvBudget {
  int64_t bytes = 0;
  std::string how;  // for the header: "--kv-cache-gb", "auto: 0.9 of the 12.0 GiB of 141.0 GiB free ..."
};

// --kv-cache-gb as GiB; 0 for auto. Throws on anything but auto or a positive number.
double parse_kv_cache_gib(const std::string& text);

KvBudget kv_cache_budget(const std::string& kv_cache_gb, double free_fraction, const ComputeBackend& backend,
                         int sharing);

// Ranks of this node bound to the same GPU as this one (several when a node has more ranks than
// GPUs): they split its free memory. Collective over the world (null: one rank): when it returns,
// every rank has loaded its weights, so the free memory each then sees is what all of them left.
int ranks_sharing_gpu(Communicator* world, const NodeLocal& node, int gpu);

// "126.9 GiB", "3.4 MiB".
std::string memory_text(double bytes);

}  // namespace shardlm
