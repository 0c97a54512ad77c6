#include "cli/run_sessions.h"

#include <algorithm>

#include "report/result_file.h"

namespace shardlm {
namespace {

double number_or(const report::RunData& d, const char* name, double fallback) {
  const auto it = d.attrs.find(name);
  return it != d.attrs.end() && it->second.is_number() ? it->second.get<double>() : fallback;
}

}  // namespace

EarlierSessions read_earlier_sessions(const std::string& path) {
  const report::RunData d = report::load_run(path);
  EarlierSessions e;
  const auto start = d.attrs.find("start_time");
  if (start != d.attrs.end() && start->second.is_string()) e.start_time = start->second.get<std::string>();
  // A file from before sessions were counted holds one.
  e.sessions = static_cast<int64_t>(number_or(d, "sessions", 1));
  const report::RequestRows& r = d.requests;  // the committed rows only
  const size_t n = r.size();
  e.rows = static_cast<int64_t>(n);
  for (size_t i = 0; i < n; ++i)
    e.stats.add_row(r.prompt_len[i], r.output_len[i], !r.error[i].empty(), r.t_queued[i], r.t_first_token[i],
                    r.t_finished[i]);
  const double ended = number_or(d, "wall_seconds", -1);
  if (ended >= 0) {
    e.stats.wall_s = ended;  // every session up to the last, which ended
    e.stats.preemptions = static_cast<int64_t>(number_or(d, "preemptions", 0));
  } else {
    // The last session was killed: its running time is at least its last finished row's time
    // (row times count from their session's start).
    const auto first = static_cast<size_t>(std::clamp<double>(number_or(d, "session_rows_before", 0), 0, n));
    double last = 0;
    for (size_t i = first; i < n; ++i) last = std::max(last, r.t_finished[i]);
    e.stats.wall_s = number_or(d, "wall_seconds_before", 0) + last;
    e.stats.preemptions = static_cast<int64_t>(number_or(d, "preemptions_before", 0));
  }
  e.stats.steps = static_cast<int64_t>(d.steps.size());
  return e;
}

const std::vector<std::string>& end_of_run_attributes() {
  static const std::vector<std::string> names = {
      "end_time",           "summary",        "requests",   "request_errors",       "prompt_tokens",
      "output_tokens",      "wall_seconds",   "steps",      "preemptions",          "output_tokens_per_s",
      "total_tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p90_s",           "ttft_p99_s",
      "tpot_p50_s",         "tpot_p90_s",     "tpot_p99_s", "interrupted_by_signal"};
  return names;
}

void write_session_start(ResultWriter& w, const EarlierSessions& earlier, const std::string& started) {
  for (const std::string& name : end_of_run_attributes()) w.remove_attr(name);
  w.set_attr("start_time", earlier.start_time.empty() ? started : earlier.start_time);
  w.set_attr("session_start_time", started);
  w.set_attr("sessions", earlier.sessions + 1);
  w.set_attr("session_rows_before", earlier.rows);
  w.set_attr("wall_seconds_before", earlier.stats.wall_s);
  w.set_attr("preemptions_before", earlier.stats.preemptions);
}

}  // namespace shardlm
