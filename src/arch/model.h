// Model: one forward step over a flattened batch of tokens from many sequences, on this rank's
// shard (its pipeline stage's layers, its tensor-parallel slice of each).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "arch/expert_wire.h"
#include "arch/shard_plan.h"
#include "compute/backend.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "model/model_spec.h"

namespace shardlm {

class ComputeBackend;
class Checkpoint;

// The tokens of one step. Every token carries its position in its sequence, the KV slot it writes
// and its sequence; prefill chunks and decode tokens are handled alike. Plain arrays, so the
// replica leader can broadcast a step to the other ranks of its replica.
struct ForwardBatch {
  std::vector<int32_t> tokens;           // [T]
  std::vector<int32_t> positions;        // [T]
  std::vector<int64_t> slots;            // [T] block * block_size + offset
  std::vector<int32_t> token_seq;        // [T] index of the token's sequence in this batch
  std::vector<int32_t> seq_block_start;  // [S + 1] where each sequence's blocks start in `blocks`
  std::vector<int32_t> blocks;           // the batch's block tables, concatenated
  std::vector<int32_t> logit_rows;       // token indices whose next-token logits are wanted
  // Empty, or one row of sampling settings per logit row: then the step is sampled where its
  // logits end (the last pipeline stage, on its device) and ended with end_step_sampled; without
  // them the logits themselves are wanted (forward, end_step).
  std::vector<SampleRow> sample_rows;
  // The tokens whose logits the sample rows edit (SampleRow::edits_begin indexes them).
  std::vector<TokenEdit> token_edits;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  // True when the step carries sample rows; throws when they do not match the logit rows, or a
  // row's token edits are not in token_edits.
  bool sampled() const;
  void clear();
  // Appends the tokens [start, start + len) of a sequence whose block table is `table`.
  void add_chunk(const int32_t* seq_tokens, int64_t start, int64_t len, const std::vector<int32_t>& table,
                 int64_t block_size, bool wants_logits);
};

// What a sampled step gives back, per logit row: the chosen token (a scored row's given one) and
// its logprob; and the rows' top alternatives, top_entries(rows) long (SampleRow::top_begin).
struct StepChoices {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_tokens;
  std::vector<float> top_logprobs;
  void resize(int64_t rows, int64_t top) {
    tokens.resize(static_cast<size_t>(rows));
    logprobs.resize(static_cast<size_t>(rows));
    top_tokens.resize(static_cast<size_t>(top));
    top_logprobs.resize(static_cast<size_t>(top));
  }
  // The backend's sample op on a step's logits, into these.
  void sample(ComputeBackend& b, const float* logits, int64_t V, const std::vector<SampleRow>& rows,
              const std::vector<TokenEdit>& edits) {
    const int64_t R = static_cast<int64_t>(rows.size());
    resize(R, top_entries(rows.data(), R));
    if (R > 0)
      b.sample(logits, R, V, rows.data(), edits.data(), tokens.data(), logprobs.data(), top_tokens.data(),
               top_logprobs.data());
  }
};

// Per-step expert-parallel figures of a rank, summed over its MoE layers.
struct MoeStepStats {
  double dispatch_s = 0, combine_s = 0;
  int64_t dispatch_bytes = 0, combine_bytes = 0;  // sent by this rank
  std::vector<int64_t> expert_tokens;             // [num_experts] tokens routed from this rank
  void reset(int64_t num_experts) {
    dispatch_s = combine_s = 0;
    dispatch_bytes = combine_bytes = 0;
    expert_tokens.assign(static_cast<size_t>(num_experts), 0);
  }
};

// One pipeline stage's part of a step, as its tp rank 0 timed it (wall seconds): the time inside
// communicator calls (tensor-parallel reductions, expert exchanges, the stage's receive of its
// input and send of its output, each with its wait for the peers) and the rest, which is compute.
// A blocking call on a device also waits for the kernels queued before it, and a replayed CUDA
// graph's collectives run inside the replay: both count as communication and compute respectively.
struct StageSeconds {
  double compute_s = 0, comm_s = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual const ShardPlan& shard() const = 0;
  // Allocates this rank's KV cache of `dtype` (F32 or BF16): as many blocks of block_size tokens as
  // fit in budget_bytes (capped at max_blocks), agreed across the replica so every rank holds the
  // same block count. Returns that count. Every rank of a replica calls it once, before the first
  // forward, with the same dtype.
  virtual int32_t allocate_kv_cache(int64_t budget_bytes, int64_t block_size, int64_t max_blocks,
                                    DType dtype = DType::F32) = 0;
  // The KV blocks of block_size tokens of `dtype` that budget_bytes hold on this rank, before
  // allocate_kv_cache's cap and its agreement across the replica: what a run resolves its context
  // limit from before any rank allocates.
  virtual int64_t kv_blocks_fitting(int64_t budget_bytes, int64_t block_size, DType dtype) const = 0;
  // Frees the KV cache (the profile steps' throwaway one, before the free memory is read). The
  // next forward needs allocate_kv_cache again.
  virtual void release_kv_cache() = 0;
  // Runs this rank's part of the step. `logits` ([logit_rows.size(), vocab], host) is filled on
  // the replica leader; other ranks pass nullptr.
  virtual void forward(const ForwardBatch& batch, float* logits) = 0;

  // Pipelined use on the replica leader: begin_step issues a step and returns once this rank's
  // part is done (the batch may be reused); end_step waits for the oldest begun step and writes its
  // logits. Up to max_steps_in_flight() steps may be begun before the first is ended, so that
  // pipeline stages work on different micro-batches at once. By default a step runs whole in
  // begin_step.
  virtual int max_steps_in_flight() const { return 1; }
  virtual void begin_step(const ForwardBatch& batch);
  virtual void end_step(float* logits);
  // Ends the oldest begun step, which carried sample rows (batch.sample_rows), with the choice of
  // each logit row and the rows' top alternatives. By default the logits come to
  // the host and the host Sampler runs on them; the decoder samples on the rank where the logits
  // end (ComputeBackend::sample, on its device), so only the choices travel back. A step with
  // logit rows but no sample rows is ended with end_step instead.
  virtual void end_step_sampled(StepChoices* out);
  // True when every step must run on every rank, even with no tokens: expert-parallel groups
  // pair their all-to-alls step by step.
  virtual bool runs_empty_steps() const { return false; }
  // MoE figures of the step last ended (end_step or forward); null for dense models. On the
  // replica leader they cover every pipeline stage's MoE layers (each stage's tp rank 0 figures,
  // summed along the pipeline); tokens per expert count the step's tokens (this engine group's
  // batch) routed to each expert.
  virtual const MoeStepStats* last_step_moe() const { return nullptr; }
  // On the replica leader: the seconds of each pipeline stage's part of the step last ended, one
  // entry per stage; null where the model does not time its steps.
  virtual const std::vector<StageSeconds>* last_step_stages() const { return nullptr; }
  // Opt-in CUDA graphs for decode steps (--cuda-graphs): returns "" when this model will capture
  // and replay the steps that allow it (the others run eagerly), else why every step runs eagerly.
  // ep_capacity: the capacity factor of a captured expert-parallel exchange
  // (--ep-graph-capacity, arch/expert_exchange.h).
  virtual std::string enable_step_graphs(double ep_capacity) { return "this model does not capture steps"; }
  std::string enable_step_graphs() { return enable_step_graphs(kDefaultEpGraphCapacity); }
  static constexpr double kDefaultEpGraphCapacity = 2.0;
  // How expert-parallel exchanges carry rows from the next step on (--ep-wire,
  // arch/expert_wire.h); a model without expert parallelism has nothing to carry.
  virtual void set_expert_wire(ExpertWire wire) {}
  // KV cache calibration (shardlm run --kv-calibrate-out): from now on every step folds each
  // layer's largest key and value magnitudes, as the cache is given them (before any fp8 scale),
  // into running maxima. Steps run eagerly while recording (a graph's padding rows would count).
  virtual void record_kv_magnitudes() { SHARDLM_FAIL("this model cannot record its KV cache's magnitudes"); }
  // [num_layers x 2] (K side, V side; 0 for a layer with no V side) over all of the model's
  // layers: this rank's layers' maxima so far, 0 for the others (callers take the maximum over the
  // ranks). Empty when not recording.
  virtual std::vector<float> kv_magnitudes() const { return {}; }
  // Steps this rank ran by replaying a captured graph, and replayed steps it redid eagerly because
  // an expert-parallel exchange's blocks overflowed (arch/expert_exchange.h; not in graph_steps).
  virtual int64_t graph_steps() const { return 0; }
  virtual int64_t graph_reruns() const { return 0; }
  // The nodes of this rank's captured graph of a step of `bucket` rows (kGraphBuckets), where
  // the backend counts them; 0 when none is captured.
  virtual int64_t graph_nodes(int64_t bucket) const { return 0; }
  // Bytes of checkpoint data this rank loaded, and the seconds it took.
  virtual size_t load_bytes() const = 0;
  virtual double load_seconds() const = 0;

 private:
  std::deque<std::vector<float>> finished_logits_;  // default begin/end: results not yet taken
  struct StepRows {
    std::vector<SampleRow> rows;
    std::vector<TokenEdit> seen;
  };
  std::deque<StepRows> finished_rows_;              // ... and their steps' sample rows
  std::vector<std::vector<float>> spare_logits_;    // ... and buffers to reuse
  std::vector<float> sampled_logits_;               // default end_step_sampled: the step's logits
  Sampler sampler_;
};

// Architecture registry (src/arch/arch_registry.cpp): config "architectures"[0] -> builder.
using ModelBuilder = std::unique_ptr<Model> (*)(const ModelSpec&, const Checkpoint&, ComputeBackend&,
                                                const ShardPlan&, const ShardComms&);
struct ArchEntry {
  const char* architecture;
  ModelBuilder build;
};
const std::vector<ArchEntry>& arch_registry();
// Throws Error listing the supported architectures when spec.architecture is unknown.
std::unique_ptr<Model> build_model(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend,
                                   const ShardPlan& plan = {}, const ShardComms& comms = {});

}  // namespace shardlm
