#include "telemetry/metrics_sink.h"

#include "telemetry/metrics_server.h"

namespace shardlm {

namespace {
constexpr const char* kTtft = "shardlm_time_to_first_token_seconds";
constexpr const char* kTtftHelp = "Time from queueing to the first token";
constexpr const char* kItl = "shardlm_inter_token_latency_seconds";
constexpr const char* kItlHelp = "Mean time per output token after the first";
}  // namespace

MetricsSink::MetricsSink(ResultSink& inner, Metrics& m, std::string file, double file_interval_s)
    : inner_(inner),
      m_(m),
      file_(std::move(file)),
      interval_(file_interval_s),
      start_(std::chrono::steady_clock::now()),
      last_write_(start_) {
  // Present from the first scrape, at zero.
  m_.counter_add("shardlm_requests_finished_total", "Requests finished (errors included)", 0);
  m_.counter_add("shardlm_requests_failed_total", "Requests finished with an error", 0);
  m_.counter_add("shardlm_output_tokens_total", "Tokens generated", 0);
  m_.counter_add("shardlm_prompt_tokens_total", "Prompt tokens of finished requests", 0);
  m_.histogram_declare(kTtft, kTtftHelp, latency_buckets());
  m_.histogram_declare(kItl, kItlHelp, latency_buckets());
}

void MetricsSink::on_result(const RequestResult& r) {
  m_.counter_add("shardlm_requests_finished_total", "Requests finished (errors included)", 1);
  if (!r.error.empty()) m_.counter_add("shardlm_requests_failed_total", "Requests finished with an error", 1);
  m_.counter_add("shardlm_output_tokens_total", "Tokens generated", static_cast<double>(r.output_tokens.size()));
  m_.counter_add("shardlm_prompt_tokens_total", "Prompt tokens of finished requests",
                 static_cast<double>(r.prompt_tokens.size()));
  output_tokens_ += static_cast<double>(r.output_tokens.size());
  if (r.error.empty() && !r.output_tokens.empty()) {
    m_.histogram_observe(kTtft, kTtftHelp, latency_buckets(), r.t_first_token - r.t_queued);
    if (r.output_tokens.size() > 1) {
      m_.histogram_observe(kItl, kItlHelp, latency_buckets(),
                           (r.t_finished - r.t_first_token) / static_cast<double>(r.output_tokens.size() - 1));
    }
  }
  inner_.on_result(r);
}

void MetricsSink::on_step(const StepRecord& s) {
  const std::string replica = "replica=\"" + std::to_string(s.replica) + "\"";
  m_.gauge_set("shardlm_requests_running", "Sequences admitted and not finished", s.running, replica);
  m_.gauge_set("shardlm_requests_waiting", "Sequences read and waiting to be admitted", s.waiting, replica);
  m_.gauge_set("shardlm_kv_blocks_used", "KV cache blocks in use", s.kv_blocks_used, replica);
  m_.counter_add("shardlm_steps_total", "Scheduler steps", 1, replica);
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed > 0) m_.gauge_set("shardlm_output_tokens_per_second", "Output tokens per second since the start", output_tokens_ / elapsed);
  if (!file_.empty() && std::chrono::duration<double>(now - last_write_).count() >= interval_) {
    last_write_ = now;
    write_metrics_file(m_, file_);
  }
  inner_.on_step(s);
}

void MetricsSink::finish() {
  if (!file_.empty()) write_metrics_file(m_, file_);
}

}  // namespace shardlm
