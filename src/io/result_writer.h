// ResultWriter: the run's HDF5 output file (schema in docs/DESIGN.md, "Outputs").
//
//   /requests/<column>   one extendable chunked 1-D dataset per column, a row per request:
//                        id (string), line (int64), prompt_tokens, output_tokens (vlen int32),
//                        output_text, finish_reason, error (strings), token_logprobs (vlen float32),
//                        top_token_ids (vlen int32) and top_logprobs (vlen float32): a request's
//                        logprobs N alternatives per output token; prompt_logprobs (vlen float32,
//                        NaN first), prompt_top_token_ids and prompt_top_logprobs: its
//                        prompt_logprobs, N per prompt token (empty lists where not asked for),
//                        t_queued, t_first_token, t_finished (float64 seconds since start),
//                        replica (int32)
//   /steps/<column>      a row per scheduler step of each replica: step (int64), replica,
//                        batch_size, prefill_tokens, decode_tokens, kv_blocks_used, running, waiting (int32),
//                        wall_s, t_start (float64), stage_compute_s, stage_comm_s (vlen float64: each
//                        pipeline stage's compute and communication seconds, arch/model.h StageSeconds)
//   /ranks/<column>      a row per rank: rank, replica, pp, tp, dp, local_rank, device (int32), host (string),
//                        load_bytes, peak_rss_bytes, tp/pp/replica/ep_bytes_sent, graph_steps,
//                        graph_reruns, device_weight_bytes, device_used_bytes (int64), load_s (float64)
//   / attributes         strings and numbers set with set_attr()
//
// Rows are appended as requests finish and the file is flushed every `flush_every` rows, every
// `flush_seconds` and at close, so a crash leaves a readable file holding what finished before the
// last flush; a resumed run opens it, keeps those rows and appends the rest. Each flush ends by
// recording the rows it made durable (root attributes rows_committed, steps_committed), and a
// resumed run keeps no row past them: a kill inside HDF5 can leave a longer extent on disk whose
// last rows were never written.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/request.h"

namespace shardlm {

// The fixed-size fields of a step (sent between ranks as raw bytes).
struct StepFields {
  int64_t step = 0;
  int32_t replica = 0;
  int32_t batch_size = 0;      // sequences in the step
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;
  int32_t kv_blocks_used = 0;
  int32_t running = 0;         // sequences admitted and not finished (all micro-batches)
  int32_t waiting = 0;         // sequences read and not yet admitted
  double t_start = 0;          // seconds since run start
  double wall_s = 0;
  // MoE models: expert-parallel all-to-all time and bytes sent by each stage's first tp rank over
  // its MoE layers, summed over the stages (zero without expert parallelism).
  double moe_dispatch_s = 0, moe_combine_s = 0;
  int64_t moe_dispatch_bytes = 0, moe_combine_bytes = 0;
};

struct StepRecord : StepFields {
  // MoE models: tokens of the step routed to each expert, summed over every stage's MoE layers
  // (load balance); empty for dense models. Each engine group records its own steps, so
  // the sum over rows counts every token once.
  std::vector<int32_t> expert_tokens;
  // Each pipeline stage's part of the step (arch/model.h StageSeconds), stage 0 first; empty where
  // the model does not time its steps.
  std::vector<double> stage_compute_s, stage_comm_s;
};

// One rank of the job, for /ranks.
struct RankRecord {
  int32_t rank = 0, replica = 0, pp = 0, tp = 0, dp = 0;
  int32_t local_rank = 0;  // index among the job's ranks on the same host
  int32_t device = -1;     // the GPU it ran on (its index on the host), -1 without one
  std::string host;
  int64_t load_bytes = 0;
  double load_s = 0;
  int64_t peak_rss_bytes = 0;
  int64_t tp_bytes_sent = 0, pp_bytes_sent = 0, replica_bytes_sent = 0, ep_bytes_sent = 0;
  int64_t graph_steps = 0;  // steps this rank ran by replaying a captured CUDA graph (--cuda-graphs)
  int64_t graph_reruns = 0;         // replayed steps redone eagerly: an ep exchange overflowed (--ep-graph-capacity)
  int64_t device_weight_bytes = 0;  // device memory its weights take (0 without a device)
  // Device memory in use when the run ended, the device's total less its free: weights, KV cache,
  // activations, libraries' buffers (and other processes' on it). 0 without a device.
  int64_t device_used_bytes = 0;
};

struct OpProfileRow;  // compute/op_profile.h

class ResultWriter {
 public:
  // Creates (truncates) path, or with resume opens an existing result file to append to it; throws
  // Error naming the path when it cannot. Buffered rows are flushed every flush_every requests
  // and, when flush_seconds > 0, at the first row or step after flush_seconds.
  explicit ResultWriter(const std::string& path, int flush_every = 64, bool resume = false, double flush_seconds = 0);
  // The request_key (io/request.h) of every request already in the file, one per row: its id, or
  // the line of one whose id could not be read (on resume: what not to run again). legacy_keys, if
  // given, gets the line key of each error row whose id is its line number: an older version gave
  // a line it could not read that id, and such a line must not get a second row.
  std::vector<std::string> finished_keys(std::vector<std::string>* legacy_keys = nullptr) const;
  ~ResultWriter();
  ResultWriter(const ResultWriter&) = delete;
  ResultWriter& operator=(const ResultWriter&) = delete;

  void append(const RequestResult& r);
  void append_step(const StepRecord& s);
  // Writes /ranks (once, at the end of the run).
  void write_ranks(const std::vector<RankRecord>& ranks);
  // Writes /op_profile (once, at the end of a run with --op-profile): every rank's op profile.
  void write_op_profile(const std::vector<OpProfileRow>& rows);
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, double value);
  void set_attr(const std::string& name, int64_t value);
  void set_attr(const std::string& name, uint64_t value);  // an unsigned 64-bit attribute (a seed)
  // Removes a root attribute where there is one (a resumed file's end-of-run figures, until the
  // run ends again).
  void remove_attr(const std::string& name);
  void flush();
  void close();  // idempotent; also done by the destructor
  int64_t rows() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm
