#include "report/stage_summary.h"

#include <cstdio>

namespace shardlm::report {

StagesSummary summarize_stages(const StepRows& st) {
  StagesSummary s;
  for (size_t i = 0; i < st.size(); ++i) {
    const std::vector<double>& compute = st.stage_compute_s[i];
    const std::vector<double>& comm = st.stage_comm_s[i];
    if (compute.empty()) continue;
    ++s.steps;
    s.wall_s += st.wall_s[i];
    if (compute.size() > s.stages.size()) s.stages.resize(compute.size());
    for (size_t k = 0; k < compute.size(); ++k) {
      s.stages[k].compute_s += compute[k];
      if (k < comm.size()) s.stages[k].comm_s += comm[k];
    }
  }
  for (size_t k = 0; k < s.stages.size(); ++k) {
    StageTimeSummary& x = s.stages[k];
    x.stage = static_cast<int64_t>(k);
    x.compute_ms = 1e3 * x.compute_s / static_cast<double>(s.steps);
    x.comm_ms = 1e3 * x.comm_s / static_cast<double>(s.steps);
    x.compute_share = s.wall_s > 0 ? x.compute_s / s.wall_s : 0;
    x.comm_share = s.wall_s > 0 ? x.comm_s / s.wall_s : 0;
  }
  return s;
}

std::string format_stages(const StagesSummary& s) {
  if (s.steps == 0) return "";
  std::string o;
  char line[256];
  std::snprintf(line, sizeof line,
                "step time by pipeline stage (its tp rank 0, %lld steps, %.3f ms of step wall each)\n",
                static_cast<long long>(s.steps), 1e3 * s.wall_s / static_cast<double>(s.steps));
  o += line;
  std::snprintf(line, sizeof line, "  %5s %16s %14s %14s %14s\n", "stage", "compute ms/step", "comm ms/step",
                "compute share", "comm share");
  o += line;
  for (const StageTimeSummary& x : s.stages) {
    std::snprintf(line, sizeof line, "  %5lld %16.3f %14.3f %13.1f%% %13.1f%%\n", static_cast<long long>(x.stage),
                  x.compute_ms, x.comm_ms, 100 * x.compute_share, 100 * x.comm_share);
    o += line;
  }
  o += "  (comm: inside communicator calls, each with its wait for the peers; shares of the step wall time)\n";
  return o;
}

nlohmann::json stages_json(const StagesSummary& s) {
  nlohmann::json per = nlohmann::json::array();
  for (const StageTimeSummary& x : s.stages)
    per.push_back({{"stage", x.stage},
                   {"compute_s", x.compute_s},
                   {"comm_s", x.comm_s},
                   {"compute_ms_per_step", x.compute_ms},
                   {"comm_ms_per_step", x.comm_ms},
                   {"compute_share", x.compute_share},
                   {"comm_share", x.comm_share}});
  return {{"steps", s.steps}, {"wall_s", s.wall_s}, {"stages", per}};
}

}  // namespace shardlm::report
