// The two halves of a decoder layer as interchangeable blocks: attention (GQA or MLA) and the
// feed-forward (dense SwiGLU MLP or Mixture-of-Experts). The decoder owns the residual stream,
// the norms, the pipeline and the tensor-parallel sums; a block maps the normed hidden state of a
// step to this rank's partial output, which the decoder sums over the tensor-parallel group.
#pragma once

#include <cstdint>
#include <memory>

#include "arch/expert_wire.h"
#include "arch/model.h"
#include "arch/scratch.h"

namespace shardlm {

class WeightLoader;

// What a block needs to know about the step besides the hidden state.
struct StepContext {
  const ForwardBatch* batch = nullptr;
  int64_t T = 0;                          // tokens in the step
  const int32_t* pos = nullptr;           // [T] positions (backend memory)
  const int64_t* slots = nullptr;         // [T] KV slots (backend memory)
  BlockTables tables;                     // each token's block list
  int64_t block_size = 0;
  // KV cache calibration (Model::record_kv_magnitudes): this layer's running maxima of |K side| and
  // |V side| as the cache is given them (backend memory, 2 floats); null when not recording.
  float* kv_amax = nullptr;
  // A step captured for replay (--cuda-graphs): its T rows include padding rows (pos -1), and
  // nothing may be read back to the host, so a Mixture-of-Experts layer keeps its routing on the
  // device (grouped_linear_routed).
  bool device_routing = false;
  // Where the step's Mixture-of-Experts layers add their expert loads ([num_experts] int64,
  // backend memory; the decoder reads it once per step, eager or captured); null: each layer
  // counts on the host.
  int64_t* expert_tokens = nullptr;
  // A captured step with expert parallelism (arch/expert_exchange.h): the exchange's capacity
  // factor (--ep-graph-capacity), and where a layer whose blocks overflowed says so (int32,
  // backend memory; the decoder redoes such a step eagerly).
  double ep_capacity = 0;
  int32_t* ep_overflow = nullptr;
  // How expert-parallel exchanges carry rows (--ep-wire, arch/expert_wire.h), eager or captured.
  ExpertWire ep_wire = ExpertWire::kF32;
};

class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // Values per token this rank caches for the layer, K side and V side (V may be 0).
  virtual int64_t k_width() const = 0;
  virtual int64_t v_width() const = 0;
  // out [T, hidden] = this rank's partial attention output for the normed hidden state h (with
  // its bf16 twin where the backend wants one); the step's keys and values go into the layer's
  // cache.
  virtual void forward(Activations h, const StepContext& ctx, const KvCacheRef& cache, Scratch& scratch,
                       float* out) = 0;
};

class FeedForwardBlock {
 public:
  virtual ~FeedForwardBlock() = default;
  // out [T, hidden] = this rank's partial output for the normed hidden state h (T = ctx.T). Called
  // on every rank of an expert-parallel group for every step, with T = 0 when the rank has no
  // tokens, so that the group's all-to-alls pair up. h has its twin as for AttentionBlock.
  virtual void forward(Activations h, const StepContext& ctx, Scratch& scratch, float* out) = 0;
};

// MoeStepStats (per-step expert-parallel figures) is declared in arch/model.h.


// Builders, one file each. `layer` is the checkpoint's layer index.
std::unique_ptr<AttentionBlock> make_gqa_attention(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                   WeightLoader& w, const float* inv_freq_dev);
std::unique_ptr<AttentionBlock> make_mla_attention(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                   WeightLoader& w);
std::unique_ptr<FeedForwardBlock> make_dense_mlp(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                 WeightLoader& w);
// `stats` outlives the block and collects its per-step figures.
std::unique_ptr<FeedForwardBlock> make_moe_block(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                 WeightLoader& w, const ShardComms& comms, MoeStepStats* stats);

}  // namespace shardlm
