// Engine: the generation loop of one replica. Pulls requests from a source, tokenises them,
// schedules continuous batches, runs the model, samples, detects stops, and hands finished
// requests (and per-step records) to a sink as soon as they finish.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "arch/model.h"
#include "engine/block_allocator.h"
#include "engine/run_stats.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "io/request.h"
#include "io/result_writer.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

class Communicator;

class RequestSource {
 public:
  virtual ~RequestSource() = default;
  virtual std::optional<ParsedRequest> next() = 0;
};

class ResultSink {
 public:
  virtual ~ResultSink() = default;
  virtual void on_result(const RequestResult& r) = 0;
  virtual void on_step(const StepRecord& s) = 0;
};

struct EngineConfig {
  SchedulerConfig scheduler;
  SamplingParams defaults;        // run-wide sampling defaults (request fields override)
  int64_t kv_cache_bytes = 4LL << 30;
  DType kv_dtype = DType::F32;    // the KV cache's elements: F32 or BF16
  double progress_interval_s = 2.0;  // <= 0: no progress lines
  int64_t total_requests = -1;       // for the progress line: left to run in the file; -1 when unknown
  int32_t replicas = 1;              // engines sharing them: the line counts against its share
  int32_t replica = 0;               // recorded with every result and step
  // Requests read ahead of the scheduler; 0 = 2 x max_seqs + 8. Replicas that share a prompt
  // file keep it to max_seqs, so that one does not claim work another idle one could do.
  int64_t lookahead = 0;
  // The leaders of the dp groups of an expert-parallel replica (null otherwise). Their MoE layers
  // pair all-to-alls step by step, so every step they agree whether any group has work or a stop
  // signal, and a group without work runs empty steps until all are done.
  Communicator* lockstep = nullptr;
  // scheduler.max_model_len is what the job's smallest KV cache holds, not a limit asked for: a
  // prompt past it is told that a larger cache raises it.
  bool context_limited_by_cache = false;
};

// The longest sequence the configuration allows before the KV cache is sized: --max-model-len where
// given, the model's max_position_embeddings otherwise.
int64_t context_limit(const ModelSpec& spec, const SchedulerConfig& cfg);

// KV blocks enough for max_seqs sequences of the full context: a larger cache would never be used.
int64_t kv_block_cap(const ModelSpec& spec, const SchedulerConfig& cfg);

class Engine {
 public:
  // Allocates the model's KV cache (on every rank of the replica: the others do it in their own
  // loop, see serve_replica_steps).
  Engine(Model& model, const Tokenizer& tokenizer, const EngineConfig& cfg);

  // Runs every request of `source` to completion. Returns the run's statistics.
  RunStats run(RequestSource& source, ResultSink& sink);

  // The context limit the engine keeps: cfg.scheduler.max_model_len where given (the constructor
  // fails where the KV cache cannot hold one sequence of it), else the smaller of the model's
  // context and the cache.
  int64_t max_model_len() const { return max_model_len_; }
  int32_t kv_blocks() const { return blocks_.num_blocks(); }
  size_t micro_batches() const { return schedulers_.size(); }

 private:
  // Turns a parsed line into a sequence, or fills `err` with its final result (an error).
  std::unique_ptr<Sequence> prepare(const ParsedRequest& req, double now, RequestResult* err) const;
  // The token edits of s's next sample row (its logit controls and penalties; nothing when it has
  // none) appended to the step's list, and the row pointed at them.
  void add_token_edits(Sequence& s, SampleRow& row, std::vector<TokenEdit>& edits);
  // Whether t ends the request (EOS unless ignored, a stop token id).
  bool is_stop_token(const SamplingParams& p, int32_t t) const {
    return (!p.ignore_eos && eos_.count(t)) ||
           std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end();
  }
  // Appends a sampled token, with its top alternatives (s.params.logprobs of them); true when the
  // sequence is finished.
  bool append_token(Sequence& s, const Sample& smp, const int32_t* top_ids, const float* top_lps, double now);
  void finalize(Sequence& s, double now);

  Model& model_;
  const Tokenizer& tok_;
  EngineConfig cfg_;
  BlockAllocator blocks_;
  // One scheduler per micro-batch: with a pipeline of P stages, P micro-batches of disjoint
  // sequences are in flight at once (one scheduler otherwise). They share the KV blocks.
  std::vector<std::unique_ptr<Scheduler>> schedulers_;
  std::set<int32_t> eos_;
  int64_t max_model_len_ = 0;
};

}  // namespace shardlm
