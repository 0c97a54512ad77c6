// shardlm merge OUT.h5 IN1.h5 IN2.h5 ...: one result file from runs over disjoint parts of a prompt
// file (the shards of a Slurm job array: slurm/array.sh, merged by slurm/merge.sbatch), readable by `shardlm report`
// and anything that reads a `shardlm run` file.
//   /requests   every input's rows, in input order. A request id found twice (in two inputs, or
//               twice in one) is an error naming both places: shards must not overlap. (Exact
//               duplicates are refused too: a row given twice means the shards were cut wrong.)
//   /steps      every input's rows, in input order; step and replica numbers are each run's own.
//   /ranks      every input's ranks, in input order.
//   /op_profile every input's op profile rows (runs with --op-profile), in input order.
//   attributes  those with the same value in every input (version, model, seed, ...) as they are;
//               the summary recomputed over all rows (requests, errors, tokens, TTFT/TPOT
//               percentiles, steps, tokens/s); start_time / end_time the earliest start and latest
//               end, wall_seconds the time between them (only when every input finished);
//               merged_from (the input count) and merge_inputs (JSON: per input its path, where its
//               rows start in each group, and every attribute of it not kept as is);
//               ranks_output_tokens, the output tokens of the sessions whose /ranks were kept
//               (each input's last), which the report divides the bytes sent by.
// Per-row times (t_queued, t_first_token, t_finished, t_start) stay relative to each input's start.
// The output is written beside OUT under a temporary name and renamed over OUT at the end.
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cli/commands.h"
#include "cli/run_identity.h"
#include "io/duplicate_id.h"
#include "cli/run_info.h"
#include "cli/subcommand.h"
#include "core/error.h"
#include "engine/run_stats.h"
#include "io/h5_group_copy.h"
#include "io/h5_util.h"
#include "report/report_summary.h"
#include "report/result_file.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

namespace shardlm {

namespace {

const char* const kUsage = "shardlm merge OUT.h5 IN1.h5 IN2.h5 ...  (or --out OUT.h5 --in IN1.h5 --in IN2.h5 ...)";
const char* const kGroups[] = {"requests", "steps", "ranks", "op_profile"};

// Attributes the merge writes itself, or that describe one input's sessions (cli/run_sessions.h:
// its rows from session_rows_before on, its earlier running time), not the merged rows: never
// copied from the inputs, even where every input has the same value.
bool recomputed(const std::string& name) {
  static const char* const names[] = {"sessions",
                                      "session_start_time",
                                      "session_rows_before",
                                      "wall_seconds_before",
                                      "preemptions_before",
                                      "command_line",
                                      "start_time",
                                      "end_time",
                                      "summary",
                                      "requests",
                                      "request_errors",
                                      "prompt_tokens",
                                      "output_tokens",
                                      "wall_seconds",
                                      "output_tokens_per_s",
                                      "total_tokens_per_s",
                                      "requests_per_s",
                                      "steps",
                                      "preemptions",
                                      "load_bytes",
                                      "load_seconds",
                                      "interrupted_by_signal",
                                      "resumed_with_requests",
                                      "layout",
                                      "merged_from",
                                      "ranks_output_tokens",
                                      "merge_inputs",
                                      "rows_committed",
                                      "steps_committed",
                                      "ttft_p50_s",
                                      "ttft_p90_s",
                                      "ttft_p99_s",
                                      "tpot_p50_s",
                                      "tpot_p90_s",
                                      "tpot_p99_s"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// "2026-11-29T22:08:42+0000" (iso_time_now) -> seconds since the epoch; nullopt when it does not parse.
std::optional<double> epoch_seconds(const std::string& iso) {
  std::tm tm{};
  const char* end = strptime(iso.c_str(), "%Y-%m-%dT%H:%M:%S%z", &tm);
  if (!end || *end) return std::nullopt;
  return static_cast<double>(timegm(&tm) - tm.tm_gmtoff);
}

std::string attr_text(const report::RunData& d, const char* name) {
  auto it = d.attrs.find(name);
  return it != d.attrs.end() && it->second.is_string() ? it->second.get<std::string>() : "";
}

double attr_number(const report::RunData& d, const char* name) {
  auto it = d.attrs.find(name);
  return it != d.attrs.end() && it->second.is_number() ? it->second.get<double>() : 0;
}

void write_json_attr(hid_t file, const std::string& name, const json& v, const std::string& ctx) {
  if (v.is_string()) {
    h5::write_attr(file, name, v.get<std::string>(), ctx);
  } else if (v.is_number_unsigned()) {
    h5::write_attr(file, name, v.get<uint64_t>(), ctx);
  } else if (v.is_number_integer()) {
    h5::write_attr(file, name, v.get<int64_t>(), ctx);
  } else if (v.is_number()) {
    h5::write_attr(file, name, v.get<double>(), ctx);
  }
}

struct Input {
  std::string path, ctx;
  report::RunData data;
  report::ReportSummary summary;
  std::map<std::string, hsize_t> rows, first_row;  // per group
};

// Plain arguments: the first is OUT (unless --out is given), the others inputs.
std::vector<std::string> normalise_args(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  bool has_out = std::find(args.begin(), args.end(), "--out") != args.end();
  std::vector<std::string> out{args.front()};
  for (size_t i = 1; i < args.size(); ++i) {
    if ((args[i] == "--out" || args[i] == "--in") && i + 1 < args.size()) {
      out.push_back(args[i]);
      out.push_back(args[++i]);
    } else if (!args[i].empty() && args[i][0] != '-') {
      out.push_back(has_out ? "--in" : "--out");
      out.push_back(args[i]);
      has_out = true;
    } else {
      out.push_back(args[i]);
    }
  }
  return out;
}

// Every id once over all inputs (only the rows that are copied: a crash can leave columns uneven),
// but for the error rows a run writes for an id repeated in its own prompts (io/duplicate_id.h).
void check_unique_ids(const std::vector<Input>& inputs) {
  std::unordered_map<std::string, std::pair<size_t, size_t>> seen;  // id -> (input, row)
  for (size_t k = 0; k < inputs.size(); ++k) {
    const report::RequestRows& r = inputs[k].data.requests;
    const auto& ids = r.id;
    const size_t n = std::min<size_t>(ids.size(), inputs[k].rows.at("requests"));
    for (size_t i = 0; i < n; ++i) {
      if (ids[i].empty()) continue;  // a line whose id could not be read: an error row of its input
      auto [it, fresh] = seen.emplace(ids[i], std::make_pair(k, i));
      if (!fresh && it->second.first == k && is_duplicate_id_error(r.error[i], ids[i])) continue;
      SHARDLM_CHECK(fresh, "shardlm merge: request id '" << ids[i] << "' is in " << inputs[it->second.first].path
                                                         << " (row " << it->second.second << ") and in "
                                                         << inputs[k].path << " (row " << i
                                                         << "): every id must come from exactly one input (were the "
                                                            "shards cut from overlapping lines, or a file given twice?)");
    }
  }
}

// The inputs are shards of one run: the same model and the same output-deciding options
// (cli/run_identity.h) as the first input that recorded them.
void check_same_run(const std::vector<Input>& inputs) {
  size_t r = 0;
  while (r + 1 < inputs.size() && attr_text(inputs[r].data, "config").empty()) ++r;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const std::vector<std::string> diff =
        output_differences(attr_text(inputs[r].data, "config"), attr_text(inputs[r].data, "model_config_hash"),
                           attr_text(inputs[k].data, "config"), attr_text(inputs[k].data, "model_config_hash"));
    if (diff.empty()) continue;
    std::string list;
    for (const std::string& d : diff) list += "\n  " + d;
    SHARDLM_FAIL("shardlm merge: " << inputs[r].path << " and " << inputs[k].path
                                   << " were made with other settings (the first's vs the second's):" << list
                                   << "\nmerge the shards of one model's run with one set of sampling options");
  }
}

// Copies every input's groups into `path` (a new file).
void write_rows(const std::string& path, std::vector<Input>& inputs) {
  const std::string ctx = "merge output '" + path + "'";
  hid_t out = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  h5::check(out, "creating the file", ctx);
  try {
    std::vector<std::unique_ptr<h5::GroupAppender>> groups;
    for (const char* g : kGroups) groups.push_back(std::make_unique<h5::GroupAppender>(out, g, ctx));
    for (Input& in : inputs) {
      hid_t f = H5Fopen(in.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      h5::check(f, "opening", in.ctx);
      try {
        for (size_t g = 0; g < groups.size(); ++g) {
          in.first_row[kGroups[g]] = groups[g]->rows();
          in.rows[kGroups[g]] = groups[g]->append_from(f, in.ctx);
        }
      } catch (...) {
        H5Fclose(f);
        throw;
      }
      H5Fclose(f);
    }
  } catch (...) {
    H5Fclose(out);
    throw;
  }
  h5::check(H5Fclose(out), "closing the file", ctx);
}

// The run-level statistics of the merged rows (as `shardlm run` computes them for its own).
RunStats merged_stats(const report::RunData& merged, const std::vector<Input>& inputs, double wall_s) {
  RunStats st;
  const report::RequestRows& r = merged.requests;
  for (size_t i = 0; i < r.size(); ++i)
    st.add_row(r.prompt_len[i], r.output_len[i], !r.error[i].empty(), r.t_queued[i], r.t_first_token[i],
               r.t_finished[i]);
  st.steps = static_cast<int64_t>(merged.steps.size());
  for (const Input& in : inputs) st.preemptions += static_cast<int64_t>(attr_number(in.data, "preemptions"));
  st.wall_s = wall_s;
  return st;
}

// Writes the root attributes of the merged file at `path`; returns its statistics.
RunStats write_attributes(const std::string& path, const std::vector<Input>& inputs, const std::string& command) {
  const std::string ctx = "merge output '" + path + "'";
  const report::RunData merged = report::load_run(path);

  // Times: the earliest start, the latest end; the wall time between them when every input ended.
  std::optional<double> t0, t1;
  std::string start, end, layouts;
  bool all_finished = true, times_ok = true;
  double max_wall = 0, load_s = 0;
  int64_t signal = 0, load_bytes = 0;
  for (const Input& in : inputs) {
    const std::string s = attr_text(in.data, "start_time"), e = attr_text(in.data, "end_time");
    const auto ts = epoch_seconds(s), te = epoch_seconds(e);
    if (ts && (!t0 || *ts < *t0)) {
      t0 = ts;
      start = s;
    }
    if (te && (!t1 || *te > *t1)) {
      t1 = te;
      end = e;
    }
    times_ok = times_ok && ts && te;
    all_finished = all_finished && in.summary.finished;
    max_wall = std::max(max_wall, in.summary.wall_s);
    if (!signal) signal = in.summary.interrupted_by_signal;
    load_bytes += static_cast<int64_t>(attr_number(in.data, "load_bytes"));
    load_s = std::max(load_s, attr_number(in.data, "load_seconds"));
    const std::string l = attr_text(in.data, "layout");
    if (!l.empty() && layouts.find(l) == std::string::npos) layouts += (layouts.empty() ? "" : " | ") + l;
  }
  const double wall = times_ok ? std::max(*t1 - *t0, max_wall) : max_wall;
  const RunStats st = merged_stats(merged, inputs, all_finished ? wall : 0);

  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  h5::check(f, "reopening the file for its attributes", ctx);
  try {
    // Attributes equal in every input are kept as they are; the others go to merge_inputs.
    std::map<std::string, json> common;
    for (const auto& [name, v] : inputs[0].data.attrs) {
      if (recomputed(name)) continue;
      bool same = true;
      for (const Input& in : inputs) {
        auto it = in.data.attrs.find(name);
        same = same && it != in.data.attrs.end() && it->second == v;
      }
      if (same) common[name] = v;
    }
    for (const auto& [name, v] : common) write_json_attr(f, name, v, ctx);
    json list = json::array();
    for (const Input& in : inputs) {
      json e = {{"path", in.path}};
      for (const char* g : kGroups) e[std::string(g)] = {{"first_row", in.first_row.at(g)}, {"rows", in.rows.at(g)}};
      e["finished"] = in.summary.finished;
      json attrs = json::object();
      for (const auto& [name, v] : in.data.attrs)
        if (!common.count(name)) attrs[name] = v;
      e["attributes"] = attrs;
      list.push_back(e);
    }
    h5::write_attr(f, "command_line", command, ctx);
    h5::write_attr(f, "merged_from", static_cast<int64_t>(inputs.size()), ctx);
    // Each input's /ranks are its last session's: the report divides their bytes by those
    // sessions' output tokens, not by every row's.
    int64_t ranks_tokens = 0;
    for (const Input& in : inputs)
      if (in.rows.at("ranks") > 0) ranks_tokens += in.summary.session_output_tokens;
    h5::write_attr(f, "ranks_output_tokens", ranks_tokens, ctx);
    h5::write_attr(f, "merge_inputs", list.dump(), ctx);
    // Every merged row is committed. An input's count, copied where all inputs hold the same (equal
    // shards), would have every reader (report, merge, --resume, which truncates to it) stop there.
    h5::write_attr(f, "rows_committed", static_cast<int64_t>(merged.requests.size()), ctx);
    h5::write_attr(f, "steps_committed", static_cast<int64_t>(merged.steps.size()), ctx);
    if (!layouts.empty()) h5::write_attr(f, "layout", layouts, ctx);
    if (!start.empty()) h5::write_attr(f, "start_time", start, ctx);
    if (!end.empty()) h5::write_attr(f, "end_time", end, ctx);
    h5::write_attr(f, "load_bytes", load_bytes, ctx);
    h5::write_attr(f, "load_seconds", load_s, ctx);
    h5::write_attr(f, "interrupted_by_signal", signal, ctx);
    h5::write_attr(f, "summary", st.summary(), ctx);
    h5::write_attr(f, "requests", st.requests, ctx);
    h5::write_attr(f, "request_errors", st.errors, ctx);
    h5::write_attr(f, "prompt_tokens", st.prompt_tokens, ctx);
    h5::write_attr(f, "output_tokens", st.output_tokens, ctx);
    h5::write_attr(f, "steps", st.steps, ctx);
    h5::write_attr(f, "preemptions", st.preemptions, ctx);
    for (double q : {50.0, 90.0, 99.0}) {
      const std::string p = std::to_string(static_cast<int>(q));
      h5::write_attr(f, "ttft_p" + p + "_s", percentile(st.ttft_s, q), ctx);
      h5::write_attr(f, "tpot_p" + p + "_s", percentile(st.tpot_s, q), ctx);
    }
    // wall_seconds marks a run that ended: written only when every input did (else `shardlm
    // report` says the merged file is incomplete, and takes its throughput from the rows).
    if (all_finished) {
      h5::write_attr(f, "wall_seconds", st.wall_s, ctx);
      h5::write_attr(f, "output_tokens_per_s", st.output_tokens_per_s(), ctx);
      h5::write_attr(f, "total_tokens_per_s", st.total_tokens_per_s(), ctx);
      h5::write_attr(f, "requests_per_s", st.requests_per_s(), ctx);
    }
  } catch (...) {
    H5Fclose(f);
    throw;
  }
  h5::check(H5Fclose(f), "closing the file", ctx);
  return st;
}

// Rows of /requests that will be copied from an input (the shortest of its columns).
hsize_t request_rows(const Input& in) {
  hid_t f = H5Fopen(in.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  h5::check(f, "opening", in.ctx);
  hsize_t n = 0;
  try {
    n = h5::GroupAppender::rows_in(f, "requests", in.ctx);
  } catch (...) {
    H5Fclose(f);
    throw;
  }
  H5Fclose(f);
  return n;
}

}  // namespace

int cmd_merge(int argc, char** argv) {
  std::string out;
  std::vector<std::string> in_paths;
  po::options_description d("shardlm merge options");
  d.add_options()("out", po::value(&out), "the merged result file (also the first plain argument; replaced if it exists)")(
      "in", po::value(&in_paths)->composing(), "an input result file (repeatable; also every further plain argument)");
  std::vector<std::string> args = normalise_args(argc, argv);
  std::vector<char*> av;
  for (std::string& a : args) av.push_back(a.data());
  po::variables_map vm;
  if (!parse_subcommand(static_cast<int>(av.size()), av.data(), "merge", kUsage, d, &vm)) return 0;
  SHARDLM_CHECK(!out.empty() && !in_paths.empty(), "shardlm merge: give the output and at least one input (" << kUsage << ")");

  std::vector<Input> inputs;
  for (const std::string& p : in_paths) {
    std::error_code ec;
    SHARDLM_CHECK(!fs::exists(out, ec) || !fs::equivalent(out, p, ec),
                  "shardlm merge: the output " << out << " is also an input: write the merge to a new file");
    Input in;
    in.path = p;
    in.ctx = "result file '" + p + "'";
    in.data = report::load_run(p);
    in.summary = report::summarize(in.data);
    in.rows["requests"] = request_rows(in);
    if (in.summary.interrupted_by_signal > 0) {
      std::fprintf(stderr, "[shardlm merge] warning: %s was interrupted by signal %lld: its requests are partial (finish it "
                   "with shardlm run --resume before merging)\n", p.c_str(), static_cast<long long>(in.summary.interrupted_by_signal));
    } else if (!in.summary.finished) {
      std::fprintf(stderr, "[shardlm merge] warning: %s has no end-of-run attributes (the run crashed or is still "
                   "running): its requests are partial\n", p.c_str());
    }
    inputs.push_back(std::move(in));
  }
  check_same_run(inputs);
  check_unique_ids(inputs);

  const std::string tmp = out + ".merging." + std::to_string(::getpid());
  RunStats st;
  try {
    write_rows(tmp, inputs);
    st = write_attributes(tmp, inputs, command_line(argc + 1, argv - 1));
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  hsize_t ranks = 0;
  for (const Input& in : inputs) ranks += in.rows.at("ranks");
  std::fprintf(stderr, "[shardlm merge] %zu inputs -> %s: %lld requests (%lld errors), %lld steps, %llu ranks; %s\n",
               inputs.size(), out.c_str(), static_cast<long long>(st.requests), static_cast<long long>(st.errors),
               static_cast<long long>(st.steps), static_cast<unsigned long long>(ranks), st.summary().c_str());
  return 0;
}

}  // namespace shardlm
