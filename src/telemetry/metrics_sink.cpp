#include "telemetry/metrics_sink.h"

#include "engine/run_stats.h"
#include "telemetry/metrics_server.h"

namespace shardlm {

namespace {
constexpr const char* kTtft = "shardlm_time_to_first_token_seconds";
constexpr const char* kTtftHelp = "Time from queueing to the first token";
// Per request, as vLLM's vllm:request_time_per_output_token_seconds (not its inter-token latency,
// which observes every gap between two tokens).
constexpr const char* kTpot = "shardlm_request_time_per_output_token_seconds";
constexpr const char* kTpotHelp = "Per request: mean time per output token after the first";
constexpr const char* kPromptTokens = "shardlm_prompt_tokens_total";
constexpr const char* kPromptTokensHelp = "Prompt tokens the model ran (of finished requests without error)";
}  // namespace

MetricsSink::MetricsSink(Metrics& m, std::string file, double file_interval_s)
    : m_(m),
      file_(std::move(file)),
      interval_(file_interval_s),
      start_(std::chrono::steady_clock::now()),
      last_write_(start_) {
  // Present from the first scrape, at zero.
  m_.counter_add("shardlm_requests_finished_total", "Requests finished (errors included)", 0);
  m_.counter_add("shardlm_requests_failed_total", "Requests finished with an error", 0);
  m_.counter_add("shardlm_output_tokens_total", "Tokens generated", 0);
  m_.counter_add(kPromptTokens, kPromptTokensHelp, 0);
  m_.histogram_declare(kTtft, kTtftHelp, latency_buckets());
  m_.histogram_declare(kTpot, kTpotHelp, latency_buckets());
}

void MetricsSink::on_result(const RequestResult& r) {
  m_.counter_add("shardlm_requests_finished_total", "Requests finished (errors included)", 1);
  if (!r.error.empty()) m_.counter_add("shardlm_requests_failed_total", "Requests finished with an error", 1);
  m_.counter_add("shardlm_output_tokens_total", "Tokens generated", static_cast<double>(r.output_tokens.size()));
  output_tokens_ += static_cast<double>(r.output_tokens.size());
  if (prompt_ran(!r.error.empty(), static_cast<int64_t>(r.output_tokens.size()))) {
    m_.counter_add(kPromptTokens, kPromptTokensHelp, static_cast<double>(r.prompt_tokens.size()));
    m_.histogram_observe(kTtft, kTtftHelp, latency_buckets(), r.t_first_token - r.t_queued);
    if (r.output_tokens.size() > 1) {
      m_.histogram_observe(kTpot, kTpotHelp, latency_buckets(),
                           (r.t_finished - r.t_first_token) / static_cast<double>(r.output_tokens.size() - 1));
    }
  }
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
}

void MetricsSink::finish() {
  if (!file_.empty()) write_metrics_file(m_, file_);
}

}  // namespace shardlm
