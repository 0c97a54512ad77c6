// Feeds the run metrics from every finished request and step that reaches the writer rank (its own
// replica's and the others'), as the result file holds them: the writer's sink passes each row on
// once written (cli/run_sinks.h), so a duplicate id counts as the error row it becomes.
#pragma once

#include <chrono>
#include <string>

#include "engine/engine.h"
#include "telemetry/metrics.h"

namespace shardlm {

class MetricsSink final : public ResultSink {
 public:
  // file: when not empty, the metrics are written there every file_interval_s seconds.
  MetricsSink(Metrics& m, std::string file, double file_interval_s);
  void on_result(const RequestResult& r) override;
  void on_step(const StepRecord& s) override;
  // Writes the file a last time (when one is configured).
  void finish();

 private:
  Metrics& m_;
  std::string file_;
  double interval_;
  std::chrono::steady_clock::time_point start_, last_write_;
  double output_tokens_ = 0;
};

}  // namespace shardlm
