// A result file written by more than one session (`shardlm run --resume` after a requeue, a time
// limit or a crash): its summary is the whole file's, not the last session's.
//
// Root attributes a session writes at its start: start_time (the first session's, kept),
// session_start_time (this one's), sessions (this one included), session_rows_before (the rows kept
// from earlier sessions) and wall_seconds_before (their running time); and it removes the
// end-of-run attributes until it writes them again, so that a file being resumed does not read as
// finished. At the end, requests, tokens, latency percentiles, steps and preemptions count every
// session's rows, and wall_seconds is the sessions' running time added up (the time between them,
// queued or requeued, is not in it), so that tok/s is what the rows took to compute.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "engine/run_stats.h"
#include "io/result_writer.h"

namespace shardlm {

struct EarlierSessions {
  RunStats stats;          // their kept rows, running time, steps and preemptions
  std::string start_time;  // the first session's ("" for a new file)
  int64_t sessions = 0;    // how many there were
  int64_t rows = 0;        // the rows kept from them
  std::string config;      // the options the last of them recorded (to_ini), "" if none
  std::string model_config_hash;
  std::string version, git_commit;  // of the shardlm that wrote its last session ("" if not recorded)
  int64_t max_model_len = 0;        // the context limit its rows were made under; 0 if not recorded
  int64_t max_model_len_asked = 0;  // its --max-model-len (0: none, or not recorded)
};

// Reads the file a resumed run continues, before its writer opens it: rows past the last commit
// are not counted (the writer drops them). A session that did not end (killed) counts up to its
// last finished row.
EarlierSessions read_earlier_sessions(const std::string& path);

// The root attributes a run writes when it ends, in order: end_time, the summary of every session's
// rows (requests, tokens, wall_seconds, rates, steps, preemptions, TTFT and TPOT percentiles) and
// interrupted_by_signal (0: it ran to the end). write_session_start removes the same names.
struct SummaryAttribute {
  std::string name;
  std::variant<int64_t, double, std::string> value;
};
std::vector<SummaryAttribute> end_of_run_attributes(const RunStats& stats, int interrupted_by_signal);
void write_summary(ResultWriter& w, const RunStats& stats, int interrupted_by_signal);

// This session's start attributes (above), and the end-of-run ones removed.
void write_session_start(ResultWriter& w, const EarlierSessions& earlier, const std::string& started);

}  // namespace shardlm
