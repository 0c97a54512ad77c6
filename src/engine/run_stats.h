// Run-level statistics: throughput and latency percentiles.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/request.h"

namespace shardlm {

struct RunStats {
  int64_t requests = 0, errors = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  int64_t steps = 0, preemptions = 0;
  double wall_s = 0;
  int interrupted_by = 0;  // the signal that stopped the run early, 0 when it ran to the end
  std::vector<double> ttft_s;  // per request, time to first token (from queueing)
  std::vector<double> tpot_s;  // per request with >1 token: mean time per output token after the first

  // Counts one finished request (tokens, errors, latencies). Prompt tokens count where the model
  // ran them: not an error row's (a prompt too long, a duplicate id), nor, in a file an earlier
  // build wrote, a max_tokens 0 request's, which completed without a step; so total tok/s is what
  // the steps computed.
  void add_result(const RequestResult& r);
  // The same from a result file's row: its prompt and output lengths, whether it holds an error,
  // and its times.
  void add_row(int64_t prompt_len, int64_t output_len, bool error, double t_queued, double t_first_token,
               double t_finished);
  double output_tokens_per_s() const { return wall_s > 0 ? output_tokens / wall_s : 0; }
  double total_tokens_per_s() const { return wall_s > 0 ? (prompt_tokens + output_tokens) / wall_s : 0; }
  double requests_per_s() const { return wall_s > 0 ? requests / wall_s : 0; }
  // One-line human summary.
  std::string summary() const;
};

// Whether a finished request's prompt went through the model: not an error row's (a prompt too
// long, a duplicate id), nor a max_tokens 0 request's (earlier builds completed one without a
// step; max_tokens must now be >= 1, as in vLLM). Prompt-token
// totals (RunStats, shardlm report, the metrics) and the latencies count these requests only.
inline bool prompt_ran(bool error, int64_t output_len) { return !error && output_len > 0; }

// q-th percentile (0..100), linear interpolation; 0 for an empty set.
double percentile(std::vector<double> v, double q);

}  // namespace shardlm
