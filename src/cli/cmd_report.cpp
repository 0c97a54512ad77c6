// shardlm report: a summary of a `shardlm run` result file (run, requests, throughput, latency
// percentiles recomputed from the rows, steps, ranks, communication), as text or --json, and with
// --plots DIR the PNGs of jobs/plot_report.py.
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/subcommand.h"
#include "core/error.h"
#include "report/report_summary.h"
#include "report/result_file.h"

namespace po = boost::program_options;

#ifndef SHARDLM_SOURCE_DIR
#define SHARDLM_SOURCE_DIR "."
#endif

namespace shardlm {

namespace {

constexpr int kPlotMissingDeps = 3;  // plot_report.py's exit code when h5py or matplotlib is missing

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The plotting script: $SHARDLM_PLOT_SCRIPT, else jobs/plot_report.py of the source tree built from.
std::string plot_script() {
  if (const char* env = std::getenv("SHARDLM_PLOT_SCRIPT"); env && *env) return env;
  return std::string(SHARDLM_SOURCE_DIR) + "/jobs/plot_report.py";
}

struct PlotOutcome {
  std::vector<std::string> written;  // PNGs the script reported, each checked to exist
  std::string problem;               // why there are none (or fewer), "" when all went well
  bool failed = false;               // the script itself failed (not merely missing its libraries)
};

// Runs `python3 SCRIPT FILE DIR`; the script prints each PNG it writes on its own stdout line and
// its messages on stderr (passed through).
PlotOutcome run_plots(const std::string& file, const std::string& dir) {
  PlotOutcome out;
  const std::string script = plot_script();
  if (!std::filesystem::exists(script)) {
    out.failed = true;
    out.problem = "plot script " + script + " not found (set SHARDLM_PLOT_SCRIPT to jobs/plot_report.py)";
    return out;
  }
  const char* py_env = std::getenv("SHARDLM_PYTHON");
  const std::string python = py_env && *py_env ? py_env : "python3";
  const std::string cmd = shell_quote(python) + " " + shell_quote(script) + " " + shell_quote(file) + " " +
                          shell_quote(dir);
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    out.failed = true;
    out.problem = "cannot start " + python + ": " + std::strerror(errno);
    return out;
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int st = pclose(p);
  const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    std::error_code ec;
    if (line.size() > 4 && line.ends_with(".png") && std::filesystem::file_size(line, ec) > 0 && !ec) {
      out.written.push_back(line);
    }
  }
  if (code == 127) {
    out.problem = python + " not found: no plots written (install Python 3 with h5py and matplotlib)";
  } else if (code == kPlotMissingDeps) {
    out.problem = python + " lacks h5py or matplotlib: no plots written (pip install h5py matplotlib)";
  } else if (code != 0) {
    out.failed = true;
    out.problem = "plot script " + script + " failed with exit code " + std::to_string(code);
  }
  return out;
}

std::string file_size_text(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? "?" : std::to_string((size + 1023) / 1024) + " KiB";
}

}  // namespace

int cmd_report(int argc, char** argv) {
  std::string file, plots_dir;
  bool as_json = false;
  po::options_description d("shardlm report options");
  d.add_options()("file", po::value(&file), "the result file (also the first plain argument)")(
      "plots", po::value(&plots_dir), "also write PNG plots into DIR (python3 with h5py and matplotlib)")(
      "json", po::bool_switch(&as_json), "print the summary as one JSON object");
  // The file may be given plainly: "report results.h5" reads as "report --file results.h5".
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--plots" || args[i] == "--file") {
      ++i;
    } else if (!args[i].empty() && args[i][0] != '-') {
      args.insert(args.begin() + static_cast<std::ptrdiff_t>(i), "--file");
      break;
    }
  }
  std::vector<char*> av;
  for (std::string& a : args) av.push_back(a.data());
  po::variables_map vm;
  if (!parse_subcommand(static_cast<int>(av.size()), av.data(), "report",
                        "shardlm report RESULTS.h5 [--plots DIR] [--json]", d, &vm))
    return 0;
  SHARDLM_CHECK(!file.empty(), "shardlm report: give the result file (shardlm report RESULTS.h5)");

  const report::ReportSummary summary = report::summarize(report::load_run(file));

  PlotOutcome plots;
  if (!plots_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(plots_dir, ec);
    SHARDLM_CHECK(!ec, "shardlm report: cannot create --plots directory '" << plots_dir << "': " << ec.message());
    plots = run_plots(file, plots_dir);
    if (!plots.problem.empty()) std::fprintf(stderr, "[shardlm report] %s\n", plots.problem.c_str());
  }

  if (as_json) {
    nlohmann::json j = report::report_json(summary);
    if (!plots_dir.empty()) {
      j["plots"] = {{"dir", plots_dir}, {"written", plots.written}, {"problem", plots.problem}};
    }
    // Strings from the file (the command line, paths) need not be UTF-8: bad bytes become U+FFFD.
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << report::format_report(summary);
    if (!plots_dir.empty()) {
      std::cout << "plots (" << plots_dir << ")\n";
      for (const std::string& png : plots.written) std::cout << "  " << png << " (" << file_size_text(png) << ")\n";
      if (!plots.problem.empty()) {
        std::cout << (plots.written.empty() ? "  none written: " : "  problem: ") << plots.problem << "\n";
      }
    }
  }
  std::cout.flush();
  return plots.failed ? 1 : 0;
}

}  // namespace shardlm
