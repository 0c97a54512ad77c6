// The KV cache budget of a rank, for shardlm run and shardlm bench: --kv-cache-gb as GiB, or auto:
// on a device, once the weights are loaded and the profile steps (engine/profile_steps.h) have
// grown every per-step buffer to its peak, a share (--kv-cache-free-fraction) of the memory then
// free, divided among the ranks sharing the device. The share left over is for what comes later:
// CUDA graphs, NCCL buffers a later collective makes, allocator slack. On the CPU 4 GiB.
#pragma once

#include <cstdint>
#include <string>

#include "compute/backend.h"
#include "engine/profile_steps.h"
#include "parallel/communicator.h"
#include "parallel/node_local.h"

namespace shardlm {

struct KvBudget {
  int64_t bytes = 0;
  std::string how;  // for the header: "--kv-cache-gb", "auto: 0.9 of the 12.0 GiB of 141.0 GiB free ..."
  ProfileResult profile;  // the profile steps that ran before it (tokens 0: none)
};

// --kv-cache-gb as GiB; 0 for auto. Throws on anything but auto or a positive number.
double parse_kv_cache_gib(const std::string& text);

// True when the budget is auto on a backend with device memory: then the profile steps run first,
// on every rank (the backend is the same on all of them).
bool kv_budget_profiles(const std::string& kv_cache_gb, const ComputeBackend& backend);

// `profile`: what run_profile_steps returned, when kv_budget_profiles said to run them.
KvBudget kv_cache_budget(const std::string& kv_cache_gb, double free_fraction, const ComputeBackend& backend,
                         int sharing, const ProfileResult& profile = {});

// Ranks of this node bound to the same GPU as this one (several when a node has more ranks than
// GPUs): they split its free memory. Collective over the world (null: one rank): when it returns,
// every rank has loaded its weights, so the free memory each then sees is what all of them left.
int ranks_sharing_gpu(Communicator* world, const NodeLocal& node, int gpu);

// "126.9 GiB", "3.4 MiB".
std::string memory_text(double bytes);

}  // namespace shardlm
