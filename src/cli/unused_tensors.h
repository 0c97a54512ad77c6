// Checkpoint tensors that no rank of a job read. A config.json that names fewer layers, experts or
// heads than the checkpoint holds, or a checkpoint of another architecture that shares the names
// the model reads, would otherwise load a model other than the one on disk without a word
// (transformers warns of such weights at load). Tensors a run leaves out by design are counted
// apart: DeepSeek-V3's multi-token-prediction layers (for speculative decoding, which vLLM also
// skips without it) and rotary inv_freq buffers (the run computes its own).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardlm {

class Checkpoint;
class Communicator;

struct UnusedTensors {
  int64_t unexpected = 0;  // tensors nobody read that the model should have
  int64_t unexpected_bytes = 0;
  std::string summary;  // those, grouped by name pattern (name_patterns)
};

// Collective over world (null: a job of one rank): every rank passes its own checkpoint, after
// its model has loaded its shard.
UnusedTensors find_unused_tensors(const Checkpoint& ckpt, Communicator* world);

// On rank 0: a warning naming the unexpected ones, if any.
void say_unused_tensors(const UnusedTensors& u, const std::string& model_dir);

// Names grouped by their first three components, digits as '*' ("model.layers.*"), the largest
// groups first, at most max_groups of them: "model.layers.* (18 tensors, numbered 3-4, e.g.
// model.layers.3.input_layernorm.weight)" (the range of each name's first number), or the name
// alone for a group of one.
std::string name_patterns(const std::vector<std::string>& names, size_t max_groups = 6);

}  // namespace shardlm
