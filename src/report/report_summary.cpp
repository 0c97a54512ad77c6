#include "report/report_summary.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <map>
#include <optional>
#include <sstream>

#include "arch/expert_wire.h"
#include "core/error.h"
#include "engine/run_stats.h"
#include "io/duplicate_id.h"

namespace shardlm::report {

namespace {

// The combine results' width on the wire for a run's --ep-wire (fp8 sends them in bf16); a name
// this build does not know is shown as written.
std::string combine_rows(const std::string& wire) {
  try {
    return expert_wire_name(combine_wire(parse_expert_wire(wire)));
  } catch (const Error&) {
    return wire;
  }
}

std::string attr_string(const RunData& d, const std::string& name) {
  auto it = d.attrs.find(name);
  if (it == d.attrs.end()) return "";
  if (it->second.is_string()) return it->second.get<std::string>();
  return it->second.dump();
}

// A `name = value` line of the run's options (the root attribute "config"); "" when absent.
std::string config_value(const RunData& d, const std::string& name) {
  std::istringstream lines(attr_string(d, "config"));
  const std::string key = name + " = ";
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  return "";
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

// The MoE figures of the steps (see MoeSummary); ep_bytes_sent is filled in from the ranks.
MoeSummary summarize_moe(const StepRows& st, int64_t output_tokens) {
  MoeSummary m;
  for (size_t i = 0; i < st.size(); ++i) {
    const std::vector<int64_t>& row = st.expert_tokens[i];
    if (row.empty()) continue;
    ++m.steps;
    if (row.size() > m.expert_tokens.size()) m.expert_tokens.resize(row.size(), 0);
    for (size_t e = 0; e < row.size(); ++e) m.expert_tokens[e] += row[e];
  }
  m.present = m.steps > 0;
  if (!m.present) return m;
  m.experts = static_cast<int64_t>(m.expert_tokens.size());
  double steps_wall_s = 0;  // of the steps that timed their all-to-alls (or had none)
  for (size_t i = 0; i < st.size(); ++i) {
    m.dispatch_s += st.moe_dispatch_s[i];
    m.combine_s += st.moe_combine_s[i];
    m.dispatch_bytes += st.moe_dispatch_bytes[i];
    m.combine_bytes += st.moe_combine_bytes[i];
    const bool sent = st.moe_dispatch_bytes[i] > 0 || st.moe_combine_bytes[i] > 0;
    if (sent && st.moe_dispatch_s[i] == 0 && st.moe_combine_s[i] == 0) {
      ++m.unmeasured_steps;
    } else {
      steps_wall_s += st.wall_s[i];
    }
  }
  if (steps_wall_s > 0) {
    m.dispatch_share = m.dispatch_s / steps_wall_s;
    m.combine_share = m.combine_s / steps_wall_s;
    m.all_to_all_share = (m.dispatch_s + m.combine_s) / steps_wall_s;
  }
  if (output_tokens > 0) {
    m.dispatch_bytes_per_token = static_cast<double>(m.dispatch_bytes) / static_cast<double>(output_tokens);
    m.combine_bytes_per_token = static_cast<double>(m.combine_bytes) / static_cast<double>(output_tokens);
  }
  const std::vector<int64_t>& load = m.expert_tokens;
  m.routed_tokens = std::accumulate(load.begin(), load.end(), int64_t{0});
  m.load_min = *std::min_element(load.begin(), load.end());
  m.load_max = *std::max_element(load.begin(), load.end());
  m.load_mean = static_cast<double>(m.routed_tokens) / static_cast<double>(m.experts);
  m.imbalance = m.load_mean > 0 ? static_cast<double>(m.load_max) / m.load_mean : 0;
  m.idle_experts = std::count(load.begin(), load.end(), int64_t{0});
  std::vector<int64_t> order(load.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return load[a] > load[b]; });
  // The busiest experts among those that received tokens.
  order.erase(std::remove_if(order.begin(), order.end(), [&](int64_t e) { return load[e] == 0; }), order.end());
  order.resize(std::min<size_t>(order.size(), 5));
  m.busiest = std::move(order);
  return m;
}

// /op_profile per step kind (see OpKindSummary).
std::vector<OpKindSummary> summarize_op_profile(const OpProfileRows& p) {
  std::vector<std::string> kinds;
  for (const std::string& k : p.kind)
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  std::vector<OpKindSummary> out;
  for (const std::string& kind : kinds) {
    OpKindSummary ks;
    ks.kind = kind;
    // Per rank: its steps, their time and the sections' sum; per section: each rank's figures.
    struct RankStep {
      int64_t steps = 0;
      double step_s = 0, sections_s = 0;
    };
    std::map<int64_t, RankStep> ranks;
    std::vector<std::string> names;
    std::map<std::string, std::vector<size_t>> rows_of;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p.kind[i] != kind || p.steps[i] <= 0) continue;
      RankStep& r = ranks[p.rank[i]];
      r.steps = p.steps[i];
      r.step_s = p.step_seconds[i];
      r.sections_s += p.seconds[i];
      if (!rows_of.count(p.section[i])) names.push_back(p.section[i]);
      rows_of[p.section[i]].push_back(i);
    }
    if (ranks.empty()) continue;
    ks.ranks = static_cast<int64_t>(ranks.size());
    for (const auto& [rank, r] : ranks) {
      ks.steps = std::max(ks.steps, r.steps);
      ks.step_us += r.step_s / static_cast<double>(r.steps) * 1e6 / static_cast<double>(ranks.size());
    }
    auto add = [&](const std::string& name, const std::vector<std::pair<int64_t, std::array<double, 4>>>& per_rank) {
      // per_rank: (rank, {calls, seconds, step seconds, weight bytes} per step)
      int64_t counted = 0;
      OpSectionSummary x;
      x.section = name;
      x.ranks = static_cast<int64_t>(per_rank.size());
      for (const auto& [rank, v] : per_rank) {
        const double us_per_step = v[1] * 1e6;
        x.calls_per_step += v[0] / static_cast<double>(per_rank.size());
        x.mean_us += us_per_step / static_cast<double>(per_rank.size());
        if (us_per_step >= x.max_us) {
          x.max_us = us_per_step;
          x.max_rank = rank;
        }
        x.share += (v[2] > 0 ? v[1] / v[2] : 0) / static_cast<double>(per_rank.size());
        if (v[3] > 0 && v[1] > 0) {
          x.gb_per_s += v[3] / v[1] / 1e9;
          ++counted;
        }
      }
      if (counted > 0) x.gb_per_s /= static_cast<double>(counted);
      return x;
    };
    for (const std::string& name : names) {
      std::vector<std::pair<int64_t, std::array<double, 4>>> per_rank;
      for (size_t i : rows_of[name]) {
        const double n = static_cast<double>(p.steps[i]);
        per_rank.push_back({p.rank[i],
                            {static_cast<double>(p.calls[i]) / n, p.seconds[i] / n, p.step_seconds[i] / n,
                             static_cast<double>(p.bytes[i]) / n}});
      }
      ks.sections.push_back(add(name, per_rank));
    }
    std::stable_sort(ks.sections.begin(), ks.sections.end(),
                     [](const OpSectionSummary& a, const OpSectionSummary& b) { return a.mean_us > b.mean_us; });
    std::vector<std::pair<int64_t, std::array<double, 4>>> outside;
    for (const auto& [rank, r] : ranks) {
      const double n = static_cast<double>(r.steps);
      outside.push_back({rank, {0, (r.step_s - r.sections_s) / n, r.step_s / n, 0}});
    }
    ks.sections.push_back(add("(outside sections)", outside));
    out.push_back(std::move(ks));
  }
  return out;
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
  if (is_duplicate_id_error(message)) return "duplicate id";  // not one kind per id
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
  const RunningTime ran = running_time(d);
  s.finished = ran.ended;
  s.interrupted_by_signal = static_cast<int64_t>(attr_number(d, "interrupted_by_signal").value_or(0));

  // Requests.
  const RequestRows& r = d.requests;
  std::vector<double> ttft, tpot, e2e;
  // Rows of the last session: the /ranks figures (rewritten by each session) are theirs.
  const auto session_first = static_cast<size_t>(
      std::clamp<double>(attr_number(d, "session_rows_before").value_or(0), 0, static_cast<double>(r.size())));
  s.max_model_len = static_cast<int64_t>(attr_number(d, "max_model_len").value_or(0));
  for (size_t i = 0; i < r.size(); ++i) {
    ++s.requests;
    const std::string& reason = r.finish_reason[i];
    ++s.finish_reasons[reason.empty() ? "none" : reason];
    if (s.max_model_len > 0 && reason == "length" && r.prompt_len[i] + r.output_len[i] >= s.max_model_len)
      ++s.stopped_at_context_limit;
    // Prompt tokens where the model ran them (RunStats::add_row): not an error row's, nor an
    // earlier build's max_tokens 0 request's.
    if (prompt_ran(!r.error[i].empty(), r.output_len[i])) s.prompt_tokens += r.prompt_len[i];
    s.output_tokens += r.output_len[i];
    ReplicaSummary& rep = s.replicas[r.replica[i]];
    ++rep.requests;
    rep.output_tokens += r.output_len[i];
    if (i >= session_first) s.session_output_tokens += r.output_len[i];
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
  s.wall_s = ran.seconds;
  s.wall_source = ran.ended     ? "wall_seconds"
                  : ran.earlier ? "the earlier sessions' wall_seconds_before + the last session's last t_finished"
                                : "last t_finished";
  s.sessions = static_cast<int64_t>(attr_number(d, "sessions").value_or(1));
  // A merged file: each input's /ranks are its last session's (cli/cmd_merge.cpp).
  if (const auto merged = attr_number(d, "ranks_output_tokens")) {
    s.session_output_tokens = static_cast<int64_t>(*merged);
    s.ranks_of_input_sessions = s.session_output_tokens != s.output_tokens;
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
  s.stages = summarize_stages(st);
  s.moe = summarize_moe(st, s.output_tokens);
  if (const std::string wire = config_value(d, "ep-wire"); !wire.empty()) s.moe.ep_wire = wire;

  // Ranks.
  const RankRows& k = d.ranks;
  for (size_t i = 0; i < k.size(); ++i) {
    RankSummary rs;
    rs.rank = k.rank[i];
    rs.replica = k.replica[i];
    rs.pp = k.pp[i];
    rs.tp = k.tp[i];
    rs.dp = k.dp[i];
    rs.local_rank = k.local_rank[i];
    rs.host = k.host[i];
    rs.load_bytes = k.load_bytes[i];
    rs.load_s = k.load_s[i];
    rs.load_gb_per_s = rs.load_s > 0 ? static_cast<double>(rs.load_bytes) / rs.load_s / 1e9 : 0;
    rs.peak_rss_bytes = k.peak_rss_bytes[i];
    rs.tp_bytes_sent = k.tp_bytes_sent[i];
    rs.pp_bytes_sent = k.pp_bytes_sent[i];
    rs.replica_bytes_sent = k.replica_bytes_sent[i];
    rs.ep_bytes_sent = k.ep_bytes_sent[i];
    rs.device_used_bytes = k.device_used_bytes[i];
    s.ranks_show_device = s.ranks_show_device || rs.device_used_bytes > 0;
    s.moe.ep_bytes_sent += rs.ep_bytes_sent;
    if (rs.dp != 0 || rs.ep_bytes_sent != 0) s.ranks_show_dp_ep = true;
    s.tp_bytes_sent += rs.tp_bytes_sent;
    s.pp_bytes_sent += rs.pp_bytes_sent;
    s.replica_bytes_sent += rs.replica_bytes_sent;
    s.peak_rss_max = std::max(s.peak_rss_max, rs.peak_rss_bytes);
    s.ranks.push_back(std::move(rs));
  }
  std::sort(s.ranks.begin(), s.ranks.end(), [](const RankSummary& a, const RankSummary& b) { return a.rank < b.rank; });
  if (s.session_output_tokens > 0) {
    const double n = static_cast<double>(s.session_output_tokens);
    s.tp_bytes_per_token = static_cast<double>(s.tp_bytes_sent) / n;
    s.pp_bytes_per_token = static_cast<double>(s.pp_bytes_sent) / n;
    s.replica_bytes_per_token = static_cast<double>(s.replica_bytes_sent) / n;
    s.moe.ep_bytes_per_token = static_cast<double>(s.moe.ep_bytes_sent) / n;
  }
  if (s.moe.present) s.ranks_show_dp_ep = true;
  s.op_profile = summarize_op_profile(d.op_profile);
  return s;
}

std::string format_report(const ReportSummary& s) {
  std::ostringstream o;
  char line[512];  // the fixed-width table rows
  auto row = [&](const char* label, const std::string& value) {
    std::string l = label;
    l.resize(std::max<size_t>(l.size(), 13), ' ');
    o << "  " << l << ' ' << value << '\n';  // a value of any length (a long command line)
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
  if (s.max_model_len > 0) {
    row("context limit", std::to_string(s.max_model_len) + " tokens: " + std::to_string(s.stopped_at_context_limit) +
                             (s.stopped_at_context_limit == 1 ? " request" : " requests") +
                             " stopped for length there");
  }
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
  o << format_stages(s.stages);

  if (s.moe.present) {
    const MoeSummary& m = s.moe;
    o << "mixture of experts (" << m.experts << " experts, " << m.steps << " steps with expert counts)\n";
    row("all-to-all", fmt("dispatch %.3f ms", 1e3 * m.dispatch_s) + fmt(" + combine %.3f ms", 1e3 * m.combine_s) +
                          fmt(" = %.1f%%", 100 * m.all_to_all_share) + " of the steps' wall time" +
                          fmt(" (dispatch %.1f%%", 100 * m.dispatch_share) +
                          fmt(", combine %.1f%%)", 100 * m.combine_share) +
                          (m.unmeasured_steps > 0 ? "; left out: " + std::to_string(m.unmeasured_steps) +
                                                        " step(s) replayed from graphs, not timed apart"
                                                  : std::string()));
    row("dispatch", bytes(m.dispatch_bytes_per_token) + " per output token (" +
                        bytes(static_cast<double>(m.dispatch_bytes)) + " in all, sent by the step leaders; rows in " +
                        m.ep_wire + ")");
    row("combine", bytes(m.combine_bytes_per_token) + " per output token (" +
                       bytes(static_cast<double>(m.combine_bytes)) + " in all, sent by the step leaders; rows in " +
                       combine_rows(m.ep_wire) + ")");
    row("expert load", "tokens per expert min " + std::to_string(m.load_min) + fmt(" / mean %.1f", m.load_mean) +
                           " / max " + std::to_string(m.load_max) + fmt(", imbalance (max/mean) %.2f", m.imbalance) +
                           " (" + std::to_string(m.routed_tokens) + " summed over the step rows)");
    row("idle experts", std::to_string(m.idle_experts) + " of " + std::to_string(m.experts) +
                            " never received a token");
    std::string busy;
    for (int64_t e : m.busiest) {
      const int64_t n = m.expert_tokens[static_cast<size_t>(e)];
      busy += (busy.empty() ? "" : ", ") + std::string("e") + std::to_string(e) + ": " + std::to_string(n) +
              fmt(" (%.1f%%)", 100 * share(n, m.routed_tokens));
    }
    row("busiest", busy.empty() ? "-" : busy);
  }

  o << "ranks\n";
  if (s.ranks.empty()) {
    o << "  (no /ranks in the file)\n";
  } else {
    // The dp and ep-sent columns only where they say something (MoE or data-parallel runs).
    const bool dpe = s.ranks_show_dp_ep, dev = s.ranks_show_device;
    std::snprintf(line, sizeof line, "  %4s %7s %3s %3s%s %-16s %5s %11s %8s %11s%s %11s %11s %11s%s\n", "rank",
                  "replica", "pp", "tp", dpe ? "  dp" : "", "host", "local", "load", "GB/s", "peak RSS",
                  dev ? "    dev used" : "", "tp sent", "pp sent", "repl sent", dpe ? "     ep sent" : "");
    o << line;
    for (const RankSummary& r : s.ranks) {
      char dp[32] = "", ep[32] = "", used[32] = "";
      if (dpe) {
        std::snprintf(dp, sizeof dp, " %3lld", static_cast<long long>(r.dp));
        std::snprintf(ep, sizeof ep, " %11s", bytes(static_cast<double>(r.ep_bytes_sent)).c_str());
      }
      if (dev) std::snprintf(used, sizeof used, " %11s", bytes(static_cast<double>(r.device_used_bytes)).c_str());
      std::snprintf(line, sizeof line, "  %4lld %7lld %3lld %3lld%s %-16s %5lld %11s %8.2f %11s%s %11s %11s %11s%s\n",
                    static_cast<long long>(r.rank), static_cast<long long>(r.replica), static_cast<long long>(r.pp),
                    static_cast<long long>(r.tp), dp, r.host.substr(0, 16).c_str(),
                    static_cast<long long>(r.local_rank), bytes(static_cast<double>(r.load_bytes)).c_str(),
                    r.load_gb_per_s, bytes(static_cast<double>(r.peak_rss_bytes)).c_str(), used,
                    bytes(static_cast<double>(r.tp_bytes_sent)).c_str(),
                    bytes(static_cast<double>(r.pp_bytes_sent)).c_str(),
                    bytes(static_cast<double>(r.replica_bytes_sent)).c_str(), ep);
      o << line;
    }
  }
  for (const OpKindSummary& k : s.op_profile) {
    std::snprintf(line, sizeof line, "op profile, %s steps (%lld ranks, up to %lld steps, %.1f us a step)\n",
                  k.kind.c_str(), static_cast<long long>(k.ranks), static_cast<long long>(k.steps), k.step_us);
    o << line;
    std::snprintf(line, sizeof line, "  %-24s %6s %10s %12s %12s %6s %12s %7s\n", "section", "ranks", "calls/step",
                  "mean us/step", "max us/step", "(rank)", "weights GB/s", "share");
    o << line;
    for (const OpSectionSummary& x : k.sections) {
      const std::string calls = x.section == "(outside sections)" ? "" : fmt("%.4g", x.calls_per_step);
      char rank[32];
      std::snprintf(rank, sizeof rank, "(%lld)", static_cast<long long>(x.max_rank));
      const std::string rate = x.gb_per_s > 0 ? fmt("%.1f", x.gb_per_s) : "";
      std::snprintf(line, sizeof line, "  %-24s %6lld %10s %12.1f %12.1f %6s %12s %6.1f%%\n", x.section.c_str(),
                    static_cast<long long>(x.ranks), calls.c_str(), x.mean_us, x.max_us, rank, rate.c_str(),
                    100 * x.share);
      o << line;
    }
  }
  o << "comm (bytes sent per output token"
    << (s.sessions > 1              ? ", of the last session"
        : s.ranks_of_input_sessions ? ", of each input's last session"
                                    : "")
    << ")\n";
  if (s.ranks.empty()) {
    o << "  (unknown: no /ranks in the file)\n";
    return o.str();
  }
  row("tp", bytes(s.tp_bytes_per_token) + " (" + bytes(static_cast<double>(s.tp_bytes_sent)) + " in all)");
  row("pp", bytes(s.pp_bytes_per_token) + " (" + bytes(static_cast<double>(s.pp_bytes_sent)) + " in all)");
  row("replica", bytes(s.replica_bytes_per_token) + " (" + bytes(static_cast<double>(s.replica_bytes_sent)) + " in all)");
  if (s.ranks_show_dp_ep) {
    row("ep", bytes(s.moe.ep_bytes_per_token) + " (" + bytes(static_cast<double>(s.moe.ep_bytes_sent)) + " in all)");
  }
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
                   {"max_model_len", s.max_model_len},
                   {"stopped_at_context_limit", s.stopped_at_context_limit},
                   {"prompt_tokens", s.prompt_tokens},
                   {"output_tokens", s.output_tokens},
                   {"per_replica", per_replica}};
  j["throughput"] = {{"sessions", s.sessions},
                     {"wall_s", s.wall_s},
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
  if (s.stages.steps > 0) j["steps"]["stages"] = stages_json(s.stages);
  if (s.moe.present) {
    const MoeSummary& m = s.moe;
    nlohmann::json busiest = nlohmann::json::array();
    for (int64_t e : m.busiest) {
      const int64_t n = m.expert_tokens[static_cast<size_t>(e)];
      busiest.push_back({{"expert", e}, {"tokens", n}, {"share", share(n, m.routed_tokens)}});
    }
    j["moe"] = {{"experts", m.experts},
                {"steps", m.steps},
                {"dispatch_s", m.dispatch_s},
                {"combine_s", m.combine_s},
                {"all_to_all_s", m.dispatch_s + m.combine_s},
                {"dispatch_wall_share", m.dispatch_share},
                {"combine_wall_share", m.combine_share},
                {"all_to_all_wall_share", m.all_to_all_share},
                {"unmeasured_steps", m.unmeasured_steps},
                {"dispatch_bytes", m.dispatch_bytes},
                {"combine_bytes", m.combine_bytes},
                {"dispatch_bytes_per_output_token", m.dispatch_bytes_per_token},
                {"combine_bytes_per_output_token", m.combine_bytes_per_token},
                {"ep_wire", m.ep_wire},
                {"expert_tokens", m.expert_tokens},
                {"routed_tokens", m.routed_tokens},
                {"expert_load",
                 {{"min", m.load_min},
                  {"mean", m.load_mean},
                  {"max", m.load_max},
                  {"imbalance", m.imbalance},
                  {"idle_experts", m.idle_experts},
                  {"busiest", busiest}}},
                {"ep_bytes_sent", m.ep_bytes_sent},
                {"ep_bytes_per_output_token", m.ep_bytes_per_token}};
    nlohmann::json per_rank = nlohmann::json::array();
    for (const RankSummary& r : s.ranks) per_rank.push_back({{"rank", r.rank}, {"dp", r.dp}, {"ep_bytes_sent", r.ep_bytes_sent}});
    j["moe"]["ranks"] = per_rank;
  }
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
                     {"device_used_bytes", r.device_used_bytes},
                     {"tp_bytes_sent", r.tp_bytes_sent},
                     {"pp_bytes_sent", r.pp_bytes_sent},
                     {"replica_bytes_sent", r.replica_bytes_sent}});
    if (s.ranks_show_dp_ep) {
      ranks.back()["dp"] = r.dp;
      ranks.back()["ep_bytes_sent"] = r.ep_bytes_sent;
    }
  }
  j["ranks"] = ranks;
  nlohmann::json ops = nlohmann::json::array();
  for (const OpKindSummary& k : s.op_profile) {
    nlohmann::json sections = nlohmann::json::array();
    for (const OpSectionSummary& x : k.sections)
      sections.push_back({{"section", x.section},
                          {"ranks", x.ranks},
                          {"calls_per_step", x.calls_per_step},
                          {"mean_us_per_step", x.mean_us},
                          {"max_us_per_step", x.max_us},
                          {"max_rank", x.max_rank},
                          {"share", x.share},
                          {"weights_gb_per_s", x.gb_per_s}});
    ops.push_back(
        {{"kind", k.kind}, {"ranks", k.ranks}, {"steps", k.steps}, {"step_us", k.step_us}, {"sections", sections}});
  }
  if (!ops.empty()) j["op_profile"] = ops;
  j["comm"] = {{"sessions", s.sessions},
               {"session_output_tokens", s.session_output_tokens},
               {"tp_bytes_sent", s.tp_bytes_sent},
               {"pp_bytes_sent", s.pp_bytes_sent},
               {"replica_bytes_sent", s.replica_bytes_sent},
               {"tp_bytes_per_output_token", s.tp_bytes_per_token},
               {"pp_bytes_per_output_token", s.pp_bytes_per_token},
               {"replica_bytes_per_output_token", s.replica_bytes_per_token}};
  return j;
}

}  // namespace shardlm::report
