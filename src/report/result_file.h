// Reading a `shardlm run` result file back (schema in src/io/result_writer.h) for `shardlm report`:
// whole columns of /requests, /steps and /ranks and the root attributes, through the HDF5 C API.
//
// Files cut short by a crash are read as they are: a group or column that is missing reads as
// empty, and columns of one group that differ in length are cut to the shortest.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardlm::report {

// The rows needed for the report (token ids and text are not kept: only their counts).
struct RequestRows {
  std::vector<std::string> id, finish_reason, error;
  std::vector<int64_t> prompt_len, output_len;  // lengths of the prompt_tokens / output_tokens rows
  std::vector<double> t_queued, t_first_token, t_finished;
  std::vector<int64_t> replica;
  size_t size() const { return id.size(); }
};

struct StepRows {
  std::vector<int64_t> step, replica, batch_size, prefill_tokens, decode_tokens, kv_blocks_used;
  std::vector<double> t_start, wall_s;
  // Mixture-of-experts runs (zero / empty rows in files written before these columns existed):
  // all-to-all seconds and bytes of each pipeline stage's first tp rank over its MoE layers, summed
  // over the stages, and the tokens routed to each expert over the expert-parallel group (an empty
  // row for dense models).
  std::vector<double> moe_dispatch_s, moe_combine_s;
  std::vector<int64_t> moe_dispatch_bytes, moe_combine_bytes;
  std::vector<std::vector<int64_t>> expert_tokens;
  // Each pipeline stage's compute and communication seconds in the step, stage 0 first (empty
  // rows in files written before these columns existed).
  std::vector<std::vector<double>> stage_compute_s, stage_comm_s;
  size_t size() const { return step.size(); }
};

struct RankRows {
  std::vector<int64_t> rank, replica, pp, tp, dp, local_rank;
  std::vector<std::string> host;
  std::vector<int64_t> load_bytes, peak_rss_bytes, tp_bytes_sent, pp_bytes_sent, replica_bytes_sent, ep_bytes_sent;
  std::vector<int64_t> device_used_bytes;  // 0 without a device, or in files from before the column
  std::vector<double> load_s;
  bool has_dp = false, has_ep_bytes_sent = false;  // whether the file has /ranks/dp, /ranks/ep_bytes_sent
  size_t size() const { return rank.size(); }
};

// /op_profile (runs with --op-profile): a row per rank, step kind and section.
struct OpProfileRows {
  std::vector<int64_t> rank, steps, calls, bytes;  // bytes: 0 where not counted
  std::vector<std::string> kind, section;
  std::vector<double> seconds, step_seconds;
  size_t size() const { return rank.size(); }
};

struct RunData {
  std::string path;
  // Root attributes by name: strings as JSON strings, integers and floats as JSON numbers.
  std::map<std::string, nlohmann::json> attrs;
  RequestRows requests;
  StepRows steps;
  RankRows ranks;
  OpProfileRows op_profile;
  bool has_steps = false, has_ranks = false;  // whether the groups exist at all
};

// Reads the whole file. Throws Error naming the path when it is missing, not HDF5, or lacks /requests.
RunData load_run(const std::string& path);

// The running time of the sessions that wrote the file (cli/run_sessions.h): wall_seconds once the
// last session ended; else the earlier sessions' (wall_seconds_before) plus the last one's up to
// its last finished row, since row times count from their own session's start.
struct RunningTime {
  double seconds = 0;
  bool ended = false;    // from wall_seconds
  bool earlier = false;  // an unfinished session after others: their time is added
};
RunningTime running_time(const RunData& d);

}  // namespace shardlm::report
