// Model: one forward step over a flattened batch of tokens from many sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace shardlm {

class ComputeBackend;
class Checkpoint;
class KvCache;

// The tokens of one step. Every token carries its position in its sequence, the KV slot it writes
// and its sequence's block table; prefill chunks and decode tokens are handled alike.
struct ForwardBatch {
  std::vector<int32_t> tokens;                // [T]
  std::vector<int32_t> positions;             // [T]
  std::vector<int64_t> slots;                 // [T] block * block_size + offset
  std::vector<const int32_t*> block_tables;   // [T] host pointer to the sequence's block list
  std::vector<int32_t> logit_rows;            // token indices whose next-token logits are wanted
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelSpec& spec() const = 0;
  // Runs the batch, writes K/V into the cache, and fills logits [logit_rows.size(), vocab] (host).
  virtual void forward(const ForwardBatch& batch, KvCache& cache, float* logits) = 0;
};

// Architecture registry (src/arch/arch_registry.cpp): config "architectures"[0] -> builder.
using ModelBuilder = std::unique_ptr<Model> (*)(const ModelSpec&, const Checkpoint&, ComputeBackend&);
struct ArchEntry {
  const char* architecture;
  ModelBuilder build;
};
const std::vector<ArchEntry>& arch_registry();
// Throws Error listing the supported architectures when spec.architecture is unknown.
std::unique_ptr<Model> build_model(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend);

}  // namespace shardlm
