#include "engine/run_stats.h"

#include <algorithm>
#include <cstdio>

namespace shardlm {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void RunStats::add_result(const RequestResult& r) {
  add_row(static_cast<int64_t>(r.prompt_tokens.size()), static_cast<int64_t>(r.output_tokens.size()), !r.error.empty(),
          r.t_queued, r.t_first_token, r.t_finished);
}

void RunStats::add_row(int64_t prompt_len, int64_t output_len, bool error, double t_queued, double t_first_token,
                       double t_finished) {
  ++requests;
  output_tokens += output_len;
  if (error) ++errors;
  if (!prompt_ran(error, output_len)) return;
  prompt_tokens += prompt_len;
  ttft_s.push_back(t_first_token - t_queued);
  if (output_len > 1) tpot_s.push_back((t_finished - t_first_token) / static_cast<double>(output_len - 1));
}

std::string RunStats::summary() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%lld requests (%lld errors) in %.2f s: %.1f req/s, %lld prompt + %lld output tokens, "
                "%.1f output tok/s, %.1f total tok/s; TTFT p50 %.1f ms p99 %.1f ms; TPOT p50 %.2f ms p99 %.2f ms",
                static_cast<long long>(requests), static_cast<long long>(errors), wall_s, requests_per_s(),
                static_cast<long long>(prompt_tokens), static_cast<long long>(output_tokens), output_tokens_per_s(),
                total_tokens_per_s(), 1e3 * percentile(ttft_s, 50), 1e3 * percentile(ttft_s, 99),
                1e3 * percentile(tpot_s, 50), 1e3 * percentile(tpot_s, 99));
  return buf;
}

}  // namespace shardlm
