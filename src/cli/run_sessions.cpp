#include "cli/run_sessions.h"

#include <algorithm>

#include "cli/run_identity.h"
#include "cli/run_info.h"
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
  for (auto [name, to] : {std::pair{"config", &e.config}, std::pair{"model_config_hash", &e.model_config_hash},
                          std::pair{"version", &e.version}, std::pair{"git_commit", &e.git_commit}}) {
    const auto it = d.attrs.find(name);
    if (it != d.attrs.end() && it->second.is_string()) *to = it->second.get<std::string>();
  }
  e.max_model_len = static_cast<int64_t>(number_or(d, "max_model_len", 0));
  e.max_model_len_asked = recorded_max_model_len(e.config);
  // A file from before sessions were counted holds one.
  e.sessions = static_cast<int64_t>(number_or(d, "sessions", 1));
  const report::RequestRows& r = d.requests;  // the committed rows only
  const size_t n = r.size();
  e.rows = static_cast<int64_t>(n);
  for (size_t i = 0; i < n; ++i)
    e.stats.add_row(r.prompt_len[i], r.output_len[i], !r.error[i].empty(), r.t_queued[i], r.t_first_token[i],
                    r.t_finished[i]);
  // A killed last session ran at least until its last finished row.
  const report::RunningTime ran = report::running_time(d);
  e.stats.wall_s = ran.seconds;
  e.stats.preemptions = static_cast<int64_t>(number_or(d, ran.ended ? "preemptions" : "preemptions_before", 0));
  e.stats.steps = static_cast<int64_t>(d.steps.size());
  return e;
}

std::vector<SummaryAttribute> end_of_run_attributes(const RunStats& stats, int interrupted_by_signal) {
  std::vector<SummaryAttribute> a = {
      {"end_time", iso_time_now()},
      {"summary", stats.summary()},
      {"requests", stats.requests},
      {"request_errors", stats.errors},
      {"prompt_tokens", stats.prompt_tokens},
      {"output_tokens", stats.output_tokens},
      {"wall_seconds", stats.wall_s},
      {"output_tokens_per_s", stats.output_tokens_per_s()},
      {"total_tokens_per_s", stats.total_tokens_per_s()},
      {"requests_per_s", stats.requests_per_s()},
      {"steps", stats.steps},
      {"preemptions", stats.preemptions},
  };
  for (const int q : {50, 90, 99}) {
    a.push_back({"ttft_p" + std::to_string(q) + "_s", percentile(stats.ttft_s, q)});
    a.push_back({"tpot_p" + std::to_string(q) + "_s", percentile(stats.tpot_s, q)});
  }
  a.push_back({"interrupted_by_signal", static_cast<int64_t>(interrupted_by_signal)});
  return a;
}

void write_summary(ResultWriter& w, const RunStats& stats, int interrupted_by_signal) {
  for (const SummaryAttribute& a : end_of_run_attributes(stats, interrupted_by_signal))
    std::visit([&](const auto& v) { w.set_attr(a.name, v); }, a.value);
}

void write_session_start(ResultWriter& w, const EarlierSessions& earlier, const std::string& started) {
  for (const SummaryAttribute& a : end_of_run_attributes(RunStats{}, 0)) w.remove_attr(a.name);
  w.set_attr("start_time", earlier.start_time.empty() ? started : earlier.start_time);
  w.set_attr("session_start_time", started);
  w.set_attr("sessions", earlier.sessions + 1);
  w.set_attr("session_rows_before", earlier.rows);
  w.set_attr("wall_seconds_before", earlier.stats.wall_s);
  w.set_attr("preemptions_before", earlier.stats.preemptions);
}

}  // namespace shardlm
