// The summary `shardlm report` prints for a result file: run identity, request outcomes,
// throughput, latency percentiles recomputed from the rows, scheduler steps, mixture-of-experts
// all-to-all and expert load (MoE runs only), per-rank load and communication. As text
// (format_report) or as one JSON object (report_json).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "report/result_file.h"
#include "report/stage_summary.h"

namespace shardlm::report {

// Percentiles of one latency, in seconds (linear interpolation, as the run's own summary).
struct Distribution {
  int64_t n = 0;  // samples; all values are 0 when n == 0
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution distribution(const std::vector<double>& v);

struct RankSummary {
  int64_t rank = 0, replica = 0, pp = 0, tp = 0, dp = 0, local_rank = 0;
  std::string host;
  int64_t load_bytes = 0;
  double load_s = 0;
  double load_gb_per_s = 0;  // load_bytes / load_s / 1e9; 0 when load_s is 0
  int64_t peak_rss_bytes = 0;
  int64_t tp_bytes_sent = 0, pp_bytes_sent = 0, replica_bytes_sent = 0, ep_bytes_sent = 0;
  int64_t device_used_bytes = 0;  // in use on its device at the end; 0 without one
};

// Mixture-of-experts figures, from the steps whose expert_tokens row is not empty. The step rows
// are the engine groups': all-to-all time and bytes are each stage's first tp rank's over its MoE
// layers, summed over the stages, and each row's expert_tokens counts its whole expert-parallel
// group over every stage.
struct MoeSummary {
  bool present = false;  // some step has a non-empty expert_tokens row (else the rest is 0)
  int64_t experts = 0;   // the longest expert_tokens row
  int64_t steps = 0;     // steps with a non-empty expert_tokens row
  // All-to-all seconds summed over the steps, and their share of the summed wall_s of the steps
  // that measured them: a step replayed from a CUDA graph sends its rows (bytes) without timing
  // the all-to-all apart (0 s), so it is left out of the share and counted here.
  double dispatch_s = 0, combine_s = 0;
  double dispatch_share = 0, combine_share = 0, all_to_all_share = 0;
  int64_t unmeasured_steps = 0;
  // Bytes the leaders sent, in all and per output token of the requests.
  int64_t dispatch_bytes = 0, combine_bytes = 0;
  double dispatch_bytes_per_token = 0, combine_bytes_per_token = 0;
  std::string ep_wire = "fp32";  // the rows' width on the wire (--ep-wire; fp32 for files without it)
  // Tokens routed to each expert, summed over the steps (index = expert), and their spread.
  std::vector<int64_t> expert_tokens;
  int64_t routed_tokens = 0;  // sum of expert_tokens
  int64_t load_min = 0, load_max = 0;
  double load_mean = 0;
  double imbalance = 0;  // load_max / load_mean; 0 when no token was routed
  int64_t idle_experts = 0;  // experts that never received a token
  std::vector<int64_t> busiest;  // up to 5 experts, most tokens first (ties: lower index first)
  // Bytes sent over the expert-parallel groups by all ranks (/ranks/ep_bytes_sent).
  int64_t ep_bytes_sent = 0;
  double ep_bytes_per_token = 0;
};

// /op_profile (runs with --op-profile), one step kind: each section over the ranks that ran it,
// per step of theirs: the mean time, the slowest rank's, and the mean share of the step.
struct OpSectionSummary {
  std::string section;
  int64_t ranks = 0;
  double calls_per_step = 0;       // mean over those ranks
  double mean_us = 0, max_us = 0;  // per step
  int64_t max_rank = 0;            // the rank of max_us
  double share = 0;                // mean over those ranks: the section's time / their steps'
  double gb_per_s = 0;             // weight bytes / the section's time, mean over counting ranks
};
struct OpKindSummary {
  std::string kind;
  int64_t ranks = 0;   // ranks that ran steps of the kind
  int64_t steps = 0;   // the most steps of it a rank ran
  double step_us = 0;  // a step's time, mean over those ranks
  // Largest mean first, then "(outside sections)": each rank's step time no section covered.
  std::vector<OpSectionSummary> sections;
};

struct ReplicaSummary {
  int64_t requests = 0, output_tokens = 0, steps = 0;
};

struct ReportSummary {
  std::string path;
  // The run.
  std::string version, git_commit, layout, command_line, start_time, end_time;
  bool finished = false;            // the end-of-run attributes are there (the run ended, not crashed)
  int64_t interrupted_by_signal = 0;  // the signal that stopped it early, 0 when none

  // Requests. Errors are counted by kind: the first words of the message, without "line N: ".
  int64_t requests = 0, ok = 0, errors = 0;
  std::map<std::string, int64_t> error_kinds, finish_reasons;
  int64_t prompt_tokens = 0, output_tokens = 0;
  std::map<int64_t, ReplicaSummary> replicas;
  // The context limit the run kept (the max_model_len attribute; 0 in files from before it), and
  // the requests that stopped for length there rather than at their max_tokens.
  int64_t max_model_len = 0, stopped_at_context_limit = 0;

  // Throughput over the sessions' running time (report::running_time): the wall_seconds attribute,
  // or (a file without it) the last t_finished, after the earlier sessions' time if any.
  double wall_s = 0;
  std::string wall_source;  // "wall_seconds", "last t_finished" or the two sums of a resumed file
  int64_t sessions = 1;     // the sessions that wrote the file (--resume)
  double output_tokens_per_s = 0, total_tokens_per_s = 0, requests_per_s = 0;

  // Latencies of the requests without error that produced tokens: TTFT = t_first_token - t_queued,
  // TPOT = (t_finished - t_first_token) / (n - 1) over those with n > 1 tokens, end-to-end =
  // t_finished - t_queued.
  Distribution ttft, tpot, e2e;

  // Scheduler steps (all replicas).
  int64_t steps = 0;
  double mean_batch_size = 0;
  int64_t step_prefill_tokens = 0, step_decode_tokens = 0;
  double prefill_share = 0, decode_share = 0;  // of the tokens processed by the steps
  double mean_step_wall_s = 0;
  int64_t kv_blocks_used_max = 0;
  StagesSummary stages;  // each pipeline stage's compute and communication time

  // Ranks and communication: bytes each group's ranks sent, in all and per output token. Each
  // session rewrites /ranks, so with sessions > 1 they are the last session's, per its output
  // tokens (the rows from session_rows_before on).
  std::vector<RankSummary> ranks;
  int64_t session_output_tokens = 0;
  // A merged file whose inputs' /ranks cover fewer rows than it has (an input was resumed): its
  // ranks_output_tokens, the output tokens of each input's last session, is the divisor.
  bool ranks_of_input_sessions = false;
  int64_t tp_bytes_sent = 0, pp_bytes_sent = 0, replica_bytes_sent = 0;
  double tp_bytes_per_token = 0, pp_bytes_per_token = 0, replica_bytes_per_token = 0;
  int64_t peak_rss_max = 0;
  // Whether the rank table shows the dp and ep-sent columns: MoE runs, or a rank with dp or
  // ep_bytes_sent non-zero.
  bool ranks_show_dp_ep = false;
  bool ranks_show_device = false;  // some rank had a device (device_used_bytes > 0)

  MoeSummary moe;

  std::vector<OpKindSummary> op_profile;  // empty without /op_profile; kinds as first found
};

// "line 12: prompt of 300 tokens leaves no room..." -> "prompt of": up to three words, stopping
// before a word with a digit or a parenthesis and after one ending in ':' or ','.
std::string error_kind(const std::string& message);

ReportSummary summarize(const RunData& data);

// The human-readable report (several lines, ending with a newline).
std::string format_report(const ReportSummary& s);
// The same summary as one JSON object.
nlohmann::json report_json(const ReportSummary& s);

}  // namespace shardlm::report
