// Decode steps replayed as captured backend graphs (--cuda-graphs), for one pipeline stage of
// the decoder (arch/decoder.cpp), which owns the device work; this file owns when a step may
// replay, its padded inputs, the capture and the replay.
//
// A step is graph-eligible when every row is a decode token (one token per sequence) and every
// row samples (graph_bucket); enable() checks the rest (a backend that captures, tp and ep only
// over a communicator that queues on streams). Its T rows are padded to a bucket B, and the whole
// device part of a B-row step on this stage (embedding or the received hidden states, the stage's
// layers, and on the last stage the LM head output) is captured once per bucket and replayed with
// new inputs:
//  - inputs (ids, positions, KV slots, per-token block-list starts, block ids) are written into
//    their scratch slots before the capture or replay, never inside it (upload_inputs);
//  - padding rows have id -1 (embedding gives zeros), position -1 (attention over no positions
//    gives zeros), slot -1 (no KV write) and block-list start 0 (never read); every op works row
//    by row, so they leave the real rows alone, and only the first T rows of the logits are read;
//  - the block-id slot is sized to a capacity that only grows (from the KV cache's block count:
//    without shared blocks a batch never lists more), so it rarely moves;
//  - a graph holds the scratch pointers it was captured with: when any slot is reallocated (the
//    scratch generation changes, e.g. a larger prefill ran eagerly) every graph is dropped and
//    recaptured on next use; a new KV cache drops them too (drop);
//  - before a bucket's first capture the step runs eagerly once (ready): that sizes every scratch
//    slot and backend workspace the capture touches (nothing may be allocated while capturing).
//    Run twice, the step writes the same KV entries with the same values;
//  - with tp, the layers' all-reduces are queued on the captured stream (NCCL: the decoder asks
//    capturing()), so every tp rank replays them in its graph (all ranks take the same steps, so
//    the same buckets); the vocabulary slices are gathered after the replay, eagerly, and the
//    warm-up gathers once too to size those slots;
//  - with pp, the hidden states travel between stages outside the graphs, eagerly, as in an eager
//    step (so over any communicator): a later stage receives the T rows into an input slot before
//    the replay, and its graph starts by copying them into the residual stream (the warm-up run
//    leaves its output there, so the capture must not start from it); every stage takes the same
//    steps, so each replays its own graph of the same bucket;
//  - MoE layers keep the routing on the device (StepContext::device_routing): padding rows go to
//    no expert, the expert GEMMs read their row ranges there, and the expert loads are added into
//    a device buffer, zeroed before each replay and read after it;
//  - with ep, the MoE layers' exchanges have fixed sizes (arch/expert_exchange.h), queued on the
//    captured stream. Every rank of the ep group (its stage's tp x dp ranks, whose dp groups
//    schedule their own batches) must replay the same bucket or none, so the ranks agree on it
//    step by step (step_bucket: the largest of their buckets, eager if one cannot replay; a rank
//    with no tokens replays an all-padding step). A step whose exchange overflowed its blocks (the
//    overflow flag, reduced over ep inside the graph, so every rank reads the same) is redone
//    eagerly before anything reads its result (replay returns false): the replay's KV entries
//    are written again with the eager values. The ranks also recapture together: an eager step
//    grows a rank's scratch by its own rows, and a rank that dropped its graphs alone would run
//    a warm-up step's exchanges that its peers, replaying, do not (step_bucket agrees on that too).
//    So every rank of the group holds the same buckets at every step: the inputs a step writes
//    before its replay are sized before that agreement (for the largest bucket), and after a
//    warm-up the group agrees whether any rank's scratch grew (a rank whose dp group ran only
//    small steps grows where its peers do not) and drops its other graphs together.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "arch/layer_blocks.h"
#include "arch/model.h"
#include "arch/scratch.h"
#include "arch/shard_plan.h"
#include "compute/backend.h"
#include "parallel/communicator.h"

namespace shardlm {

class KvCache;

// The row counts a graph step is padded to.
inline constexpr int64_t kGraphBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

// The bucket a step is padded to (the smallest of kGraphBuckets that holds its rows), or 0 when
// it cannot be a graph step: it has no rows or more than the largest bucket, or some row is not
// the one decode token of its own sequence (sequence t at row t) sampling its logits.
int64_t graph_bucket(const ForwardBatch& batch);

class StepGraphs {
 public:
  // plan and spec are the decoder's, and outlive this; graphs are off until enable().
  StepGraphs(ComputeBackend& b, Scratch& scratch, const ModelSpec& spec, const ShardPlan& plan,
             const ShardComms& comms);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Turns graph steps on with the ep exchanges' capacity factor (--ep-graph-capacity); returns
  // why they cannot be on ("" when they are). recording_kv: a KV cache calibration is running.
  std::string enable(double ep_capacity, bool recording_kv);
  // Off for good (a KV calibration records every step eagerly); the graphs are dropped.
  void disable();
  // Drops every captured graph: they hold the scratch and KV cache pointers they were captured with.
  void drop();
  // A step's device work is being captured: collectives must be queued on the stream.
  bool capturing() const { return capturing_; }

  // The bucket the step runs at, agreed over the ep group (see the file comment); 0: eagerly.
  // reserve_stage(rows) sizes the caller's slots that a graph step of up to `rows` rows writes
  // before its replay (a later stage's received hidden states): with ep every slot a replay
  // reads is sized before the ranks agree on their graphs.
  int64_t step_bucket(const ForwardBatch& batch, const KvCache& cache,
                      const std::function<void(int64_t rows)>& reserve_stage);

  // Writes a graph step's padded inputs into the decoder's slots 3 (ids), 4 (positions), 5 (KV
  // slots), 6 (block ids) and 7 (block-list starts) and returns its context (T = B).
  // expert_tokens: the decoder's device buffer of expert loads (null for dense models).
  StepContext upload_inputs(const ForwardBatch& batch, int64_t B, const KvCache& cache, int64_t* expert_tokens);

  // A bucket's graph and what each replay of it moves (the capture counted it once).
  struct Captured {
    int64_t handle = 0;                             // the backend's
    CommStats tp_moved;                             // calls and bytes of the tp all-reduces
    CommStats ep_moved;                             // and of the ep exchanges
    int64_t dispatch_bytes = 0, combine_bytes = 0;  // the MoE layers' exchanges
  };
  // The graph of ctx's bucket (ctx from upload_inputs), captured first if need be: `work`, the
  // stage's device part of the step, runs once eagerly with `after_warm_up` (the eager work that
  // follows a replay, run once to size its slots), then is captured. moe: the step's stats, to
  // which the MoE layers add their exchanged bytes (null for dense models).
  const Captured& ready(const StepContext& ctx, const std::function<void()>& work,
                        const std::function<void()>& after_warm_up, const MoeStepStats* moe);
  // Replays it. False when an ep exchange overflowed its blocks (the same answer on every rank of
  // the ep group): the caller redoes the step eagerly.
  bool replay(const Captured& step, const StepContext& ctx);

  // The nodes of the bucket's graph (ComputeBackend::captured_nodes); 0 when none is captured.
  int64_t nodes(int64_t bucket) const;
  int64_t steps() const { return steps_; }    // steps run by a replay
  int64_t reruns() const { return reruns_; }  // replayed steps redone eagerly

 private:
  static CommStats moved_since(const Communicator& c, const CommStats& before);
  // Sizes the input slots (upload_inputs) for the largest bucket and the batch's block list.
  void reserve_inputs(const ForwardBatch& batch, const KvCache& cache,
                      const std::function<void(int64_t rows)>& reserve_stage);
  int32_t* overflow_flag();

  ComputeBackend& b_;
  Scratch& scratch_;
  const ModelSpec& spec_;
  const ShardPlan& plan_;
  ShardComms comms_;
  bool on_ = false, capturing_ = false;
  double ep_capacity_ = Model::kDefaultEpGraphCapacity;
  std::map<int64_t, Captured> graphs_;  // by bucket
  uint64_t generation_ = 0;             // the scratch generation they were captured at
  int64_t steps_ = 0, reruns_ = 0;
  int32_t* overflow_dev_ = nullptr;  // the ep exchanges' overflow flag (one int32, backend memory)
  size_t block_capacity_ = 0;        // block ids the block-id slot is sized for
  std::vector<int32_t> ids_, pos_, start_;
  std::vector<int64_t> slots_;
};

}  // namespace shardlm
