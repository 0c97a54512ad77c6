// The step time of each pipeline stage, from the /steps stage columns (arch/model.h StageSeconds):
// how much of a step each stage's tp rank 0 spent computing and inside communicator calls. A stage
// whose compute is well under the others' idles in the pipeline; a later stage's communication
// includes its wait for the stage before.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "report/result_file.h"

namespace shardlm::report {

struct StageTimeSummary {
  int64_t stage = 0;
  double compute_s = 0, comm_s = 0;          // summed over the timed steps
  double compute_ms = 0, comm_ms = 0;        // per timed step
  double compute_share = 0, comm_share = 0;  // of the timed steps' wall time
};

struct StagesSummary {
  int64_t steps = 0;  // step rows with stage figures (none in files from before the columns)
  double wall_s = 0;  // their wall time, summed
  std::vector<StageTimeSummary> stages;
};

StagesSummary summarize_stages(const StepRows& st);
// The report's section ("" when no step was timed).
std::string format_stages(const StagesSummary& s);
nlohmann::json stages_json(const StagesSummary& s);

}  // namespace shardlm::report
