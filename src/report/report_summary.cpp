#include "report/report_summary.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>

#include "engine/run_stats.h"

namespace shardlm::report {

namespace {

std::string attr_string(const RunData& d, const std::string& name) {
  auto it = d.attrs.find(name);
  if (it == d.attrs.end()) return "";
  if (it->second.is_string()) return it->second.get<std::string>();
  return it->second.dump();
}

// A numeric attribute; nullopt when absent or not a number.
std::optional<double> attr_number(const RunData& d, const std::string& name) {
  auto it = d.attrs.find(name);
  if (it == d.attrs.end() || !it->second.is_number()) return std::nullopt;
  return it->second.get<double>();
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// 1536 -> "1.50 KiB".
std::string bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt("%.0f B", b) : fmt("%.2f ", b) + units[u];
}

std::string counts(const std::map<std::string, int64_t>& m) {
  // Most frequent first, then by name.
  std::vector<std::pair<std::string, int64_t>> v(m.begin(), m.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [k, n] : v) out += (out.empty() ? "" : ", ") + k + ": " + std::to_string(n);
  return out.empty() ? "-" : out;
}

double share(int64_t part, int64_t whole) { return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0; }

nlohmann::json dist_json(const Distribution& d) {
  return {{"n", d.n}, {"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"max", d.max}};
}

}  // namespace

Distribution distribution(const std::vector<double>& v) {
  Distribution d;
  d.n = static_cast<int64_t>(v.size());
  if (v.empty()) return d;
  d.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  d.p50 = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p99 = percentile(v, 99);
  d.max = *std::max_element(v.begin(), v.end());
  return d;
}

std::string error_kind(const std::string& message) {
  std::string m = message;
  // Drop the "line N: " prefix the reader and engine put on per-request errors.
  if (m.rfind("line ", 0) == 0) {
    size_t i = 5;
    while (i < m.size() && std::isdigit(static_cast<unsigned char>(m[i]))) ++i;
    if (i > 5 && i < m.size() && m[i] == ':') m = m.substr(i + 1);
  }
  std::istringstream in(m);
  std::string word, kind;
  int words = 0;
  while (words < 3 && in >> word) {
    if (std::any_of(word.begin(), word.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '(' || c == '['; }))
      break;
    const bool last = word.back() == ':' || word.back() == ',' || word.back() == ';';
    if (last) word.pop_back();
    if (!word.empty()) {
      kind += (kind.empty() ? "" : " ") + word;
      ++words;
    }
    if (last) break;
  }
  return kind.empty() ? "other" : kind;
}

ReportSummary summarize(const RunData& d) {
  ReportSummary s;
  s.path = d.path;
  s.version = attr_string(d, "version");
  s.git_commit = attr_string(d, "git_commit");
  s.layout = attr_string(d, "layout");
  s.command_line = attr_string(d, "command_line");
  s.start_time = attr_string(d, "start_time");
  s.end_time = attr_string(d, "end_time");
  // wall_seconds is written with the other end-of-run attributes: without it the run never ended.
  const std::optional<double> wall_attr = attr_number(d, "wall_seconds");
  s.finished = wall_attr.has_value();
  s.interrupted_by_signal = static_cast<int64_t>(attr_number(d, "interrupted_by_signal").value_or(0));

  // Requests.
  const RequestRows& r = d.requests;
  std::vector<double> ttft, tpot, e2e;
  double last_finished = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    ++s.requests;
    const std::string& reason = r.finish_reason[i];
    ++s.finish_reasons[reason.empty() ? "none" : reason];
    s.prompt_tokens += r.prompt_len[i];
    s.output_tokens += r.output_len[i];
    ReplicaSummary& rep = s.replicas[r.replica[i]];
    ++rep.requests;
    rep.output_tokens += r.output_len[i];
    last_finished = std::max(last_finished, r.t_finished[i]);
    if (!r.error[i].empty()) {
      ++s.errors;
      ++s.error_kinds[error_kind(r.error[i])];
      continue;
    }
    ++s.ok;
    const int64_t n = r.output_len[i];
    if (n == 0) continue;
    ttft.push_back(r.t_first_token[i] - r.t_queued[i]);
    e2e.push_back(r.t_finished[i] - r.t_queued[i]);
    if (n > 1) tpot.push_back((r.t_finished[i] - r.t_first_token[i]) / static_cast<double>(n - 1));
  }
  s.ttft = distribution(ttft);
  s.tpot = distribution(tpot);
  s.e2e = distribution(e2e);

  // Throughput.
  if (wall_attr && *wall_attr > 0) {
    s.wall_s = *wall_attr;
    s.wall_source = "wall_seconds";
  } else {
    s.wall_s = last_finished;
    s.wall_source = "last t_finished";
  }
  if (s.wall_s > 0) {
    s.output_tokens_per_s = static_cast<double>(s.output_tokens) / s.wall_s;
    s.total_tokens_per_s = static_cast<double>(s.prompt_tokens + s.output_tokens) / s.wall_s;
    s.requests_per_s = static_cast<double>(s.requests) / s.wall_s;
  }

  // Steps.
  const StepRows& st = d.steps;
  s.steps = static_cast<int64_t>(st.size());
  int64_t batch_sum = 0;
  double wall_sum = 0;
  for (size_t i = 0; i < st.size(); ++i) {
    batch_sum += st.batch_size[i];
    s.step_prefill_tokens += st.prefill_tokens[i];
    s.step_decode_tokens += st.decode_tokens[i];
    wall_sum += st.wall_s[i];
    s.kv_blocks_used_max = std::max(s.kv_blocks_used_max, st.kv_blocks_used[i]);
    ++s.replicas[st.replica[i]].steps;
  }
  if (s.steps > 0) {
    s.mean_batch_size = static_cast<double>(batch_sum) / static_cast<double>(s.steps);
    s.mean_step_wall_s = wall_sum / static_cast<double>(s.steps);
  }
  const int64_t step_tokens = s.step_prefill_tokens + s.step_decode_tokens;
  s.prefill_share = share(s.step_prefill_tokens, step_tokens);
  s.decode_share = share(s.step_decode_tokens, step_tokens);

  // Ranks.
  const RankRows& k = d.ranks;
  for (size_t i = 0; i < k.size(); ++i) {
    RankSummary rs;
    rs.rank = k.rank[i];
    rs.replica = k.replica[i];
    rs.pp = k.pp[i];
    rs.tp = k.tp[i];
    rs.local_rank = k.local_rank[i];
    rs.host = k.host[i];
    rs.load_bytes = k.load_bytes[i];
    rs.load_s = k.load_s[i];
    rs.load_gb_per_s = rs.load_s > 0 ? static_cast<double>(rs.load_bytes) / rs.load_s / 1e9 : 0;
    rs.peak_rss_bytes = k.peak_rss_bytes[i];
    rs.tp_bytes_sent = k.tp_bytes_sent[i];
    rs.pp_bytes_sent = k.pp_bytes_sent[i];
    rs.replica_bytes_sent = k.replica_bytes_sent[i];
    s.tp_bytes_sent += rs.tp_bytes_sent;
    s.pp_bytes_sent += rs.pp_bytes_sent;
    s.replica_bytes_sent += rs.replica_bytes_sent;
    s.peak_rss_max = std::max(s.peak_rss_max, rs.peak_rss_bytes);
    s.ranks.push_back(std::move(rs));
  }
  std::sort(s.ranks.begin(), s.ranks.end(), [](const RankSummary& a, const RankSummary& b) { return a.rank < b.rank; });
  if (s.output_tokens > 0) {
    const double n = static_cast<double>(s.output_tokens);
    s.tp_bytes_per_token = static_cast<double>(s.tp_bytes_sent) / n;
    s.pp_bytes_per_token = static_cast<double>(s.pp_bytes_sent) / n;
    s.replica_bytes_per_token = static_cast<double>(s.replica_bytes_sent) / n;
  }
  return s;
}

std::string format_report(const ReportSummary& s) {
  std::ostringstream o;
  char line[512];
  auto row = [&](const char* label, const std::string& value) {
    std::snprintf(line, sizeof line, "  %-13s %s\n", label, value.c_str());
    o << line;
  };
  o << "shardlm report: " << s.path << "\n";

  o << "run\n";
  row("version", (s.version.empty() ? "?" : s.version) + " (commit " + (s.git_commit.empty() ? "?" : s.git_commit) + ")");
  row("layout", s.layout.empty() ? "?" : s.layout);
  row("command", s.command_line.empty() ? "?" : s.command_line);
  if (!s.start_time.empty()) row("started", s.start_time + (s.end_time.empty() ? "" : ", ended " + s.end_time));
  if (s.interrupted_by_signal > 0) {
    const char* name = strsignal(static_cast<int>(s.interrupted_by_signal));
    row("status", "interrupted by signal " + std::to_string(s.interrupted_by_signal) + (name ? std::string(" (") + name + ")" : "") +
                      ": partial results (rerun with --resume to finish)");
  } else if (!s.finished) {
    row("status", "incomplete: no end-of-run attributes (the run crashed or is still running)");
  } else {
    row("status", "completed (not interrupted)");
  }

  o << "requests\n";
  row("total", std::to_string(s.requests) + " (" + std::to_string(s.ok) + " ok, " + std::to_string(s.errors) +
                   (s.errors == 1 ? " error)" : " errors)"));
  row("errors", counts(s.error_kinds));
  row("finish", counts(s.finish_reasons));
  row("tokens", std::to_string(s.prompt_tokens) + " prompt + " + std::to_string(s.output_tokens) + " output");
  if (s.replicas.size() > 1) {
    std::string v;
    for (const auto& [rep, r] : s.replicas) {
      v += (v.empty() ? "" : "; ") + std::to_string(rep) + ": " + std::to_string(r.requests) + " req, " +
           std::to_string(r.output_tokens) + " tok, " + std::to_string(r.steps) + " steps";
    }
    row("per replica", v);
  }

  o << "throughput (over " << fmt("%.3f", s.wall_s) << " s wall, from " << s.wall_source << ")\n";
  row("output", fmt("%.1f tok/s", s.output_tokens_per_s));
  row("total", fmt("%.1f tok/s", s.total_tokens_per_s));
  row("requests", fmt("%.2f req/s", s.requests_per_s));

  o << "latency (ms)          n       mean        p50        p90        p99        max\n";
  auto lat = [&](const char* label, const Distribution& d) {
    std::snprintf(line, sizeof line, "  %-13s %6lld %10.3f %10.3f %10.3f %10.3f %10.3f\n", label,
                  static_cast<long long>(d.n), 1e3 * d.mean, 1e3 * d.p50, 1e3 * d.p90, 1e3 * d.p99, 1e3 * d.max);
    o << line;
  };
  lat("TTFT", s.ttft);
  lat("TPOT", s.tpot);
  lat("end-to-end", s.e2e);

  o << "steps\n";
  row("count", std::to_string(s.steps));
  if (s.steps > 0) {
    row("batch size", fmt("mean %.2f", s.mean_batch_size));
    row("tokens", fmt("prefill %.1f%%", 100 * s.prefill_share) + " (" + std::to_string(s.step_prefill_tokens) + "), " +
                      fmt("decode %.1f%%", 100 * s.decode_share) + " (" + std::to_string(s.step_decode_tokens) + ")");
    row("step wall", fmt("mean %.3f ms", 1e3 * s.mean_step_wall_s));
    row("KV blocks", "max " + std::to_string(s.kv_blocks_used_max) + " used");
  }

  o << "ranks\n";
  if (s.ranks.empty()) {
    o << "  (no /ranks in the file)\n";
  } else {
    std::snprintf(line, sizeof line, "  %4s %7s %3s %3s %-16s %5s %11s %8s %11s %11s %11s %11s\n", "rank", "replica",
                  "pp", "tp", "host", "local", "load", "GB/s", "peak RSS", "tp sent", "pp sent", "repl sent");
    o << line;
    for (const RankSummary& r : s.ranks) {
      std::snprintf(line, sizeof line, "  %4lld %7lld %3lld %3lld %-16s %5lld %11s %8.2f %11s %11s %11s %11s\n",
                    static_cast<long long>(r.rank), static_cast<long long>(r.replica), static_cast<long long>(r.pp),
                    static_cast<long long>(r.tp), r.host.substr(0, 16).c_str(), static_cast<long long>(r.local_rank),
                    bytes(static_cast<double>(r.load_bytes)).c_str(), r.load_gb_per_s,
                    bytes(static_cast<double>(r.peak_rss_bytes)).c_str(),
                    bytes(static_cast<double>(r.tp_bytes_sent)).c_str(),
                    bytes(static_cast<double>(r.pp_bytes_sent)).c_str(),
                    bytes(static_cast<double>(r.replica_bytes_sent)).c_str());
      o << line;
    }
  }
  o << "comm (bytes sent per output token)\n";
  if (s.ranks.empty()) {
    o << "  (unknown: no /ranks in the file)\n";
    return o.str();
  }
  row("tp", bytes(s.tp_bytes_per_token) + " (" + bytes(static_cast<double>(s.tp_bytes_sent)) + " in all)");
  row("pp", bytes(s.pp_bytes_per_token) + " (" + bytes(static_cast<double>(s.pp_bytes_sent)) + " in all)");
  row("replica", bytes(s.replica_bytes_per_token) + " (" + bytes(static_cast<double>(s.replica_bytes_sent)) + " in all)");
  return o.str();
}

nlohmann::json report_json(const ReportSummary& s) {
  nlohmann::json j;
  j["file"] = s.path;
  j["run"] = {{"version", s.version},       {"git_commit", s.git_commit},
              {"layout", s.layout},         {"command_line", s.command_line},
              {"start_time", s.start_time}, {"end_time", s.end_time},
              {"finished", s.finished},     {"interrupted", s.interrupted_by_signal > 0},
              {"interrupted_by_signal", s.interrupted_by_signal}};
  nlohmann::json per_replica = nlohmann::json::array();
  for (const auto& [rep, r] : s.replicas) {
    per_replica.push_back({{"replica", rep}, {"requests", r.requests}, {"output_tokens", r.output_tokens}, {"steps", r.steps}});
  }
  j["requests"] = {{"total", s.requests},
                   {"ok", s.ok},
                   {"errors", s.errors},
                   {"error_kinds", s.error_kinds},
                   {"finish_reasons", s.finish_reasons},
                   {"prompt_tokens", s.prompt_tokens},
                   {"output_tokens", s.output_tokens},
                   {"per_replica", per_replica}};
  j["throughput"] = {{"wall_s", s.wall_s},
                     {"wall_source", s.wall_source},
                     {"output_tokens_per_s", s.output_tokens_per_s},
                     {"total_tokens_per_s", s.total_tokens_per_s},
                     {"requests_per_s", s.requests_per_s}};
  j["latency_s"] = {{"ttft", dist_json(s.ttft)}, {"tpot", dist_json(s.tpot)}, {"e2e", dist_json(s.e2e)}};
  j["steps"] = {{"count", s.steps},
                {"mean_batch_size", s.mean_batch_size},
                {"prefill_tokens", s.step_prefill_tokens},
                {"decode_tokens", s.step_decode_tokens},
                {"prefill_share", s.prefill_share},
                {"decode_share", s.decode_share},
                {"mean_wall_s", s.mean_step_wall_s},
                {"kv_blocks_used_max", s.kv_blocks_used_max}};
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankSummary& r : s.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"replica", r.replica},
                     {"pp", r.pp},
                     {"tp", r.tp},
                     {"local_rank", r.local_rank},
                     {"host", r.host},
                     {"load_bytes", r.load_bytes},
                     {"load_s", r.load_s},
                     {"load_gb_per_s", r.load_gb_per_s},
                     {"peak_rss_bytes", r.peak_rss_bytes},
                     {"tp_bytes_sent", r.tp_bytes_sent},
                     {"pp_bytes_sent", r.pp_bytes_sent},
                     {"replica_bytes_sent", r.replica_bytes_sent}});
  }
  j["ranks"] = ranks;
  j["comm"] = {{"tp_bytes_sent", s.tp_bytes_sent},
               {"pp_bytes_sent", s.pp_bytes_sent},
               {"replica_bytes_sent", s.replica_bytes_sent},
               {"tp_bytes_per_output_token", s.tp_bytes_per_token},
               {"pp_bytes_per_output_token", s.pp_bytes_per_token},
               {"replica_bytes_per_output_token", s.replica_bytes_per_token}};
  return j;
}

}  // namespace shardlm::report
