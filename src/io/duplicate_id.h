// The error row a run writes for a request whose id an earlier request of the file has
// (cli/run_sinks.h): the file then holds that id's output once. shardlm merge recognises such a row
// beside the first one of its input and copies both, as the run wrote them.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

inline std::string duplicate_id_error(int64_t line, const std::string& id) {
  return "line " + std::to_string(line) + ": duplicate id '" + id + "' (an earlier request has it)";
}

// Whether `error` is such a row's, for the id (whatever its line).
inline bool is_duplicate_id_error(const std::string& error, const std::string& id) {
  const std::string tail = ": duplicate id '" + id + "' (an earlier request has it)";
  return error.rfind("line ", 0) == 0 && error.size() > tail.size() &&
         error.compare(error.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether `error` is such a row's, for any id.
inline bool is_duplicate_id_error(const std::string& error) {
  const std::string tail = "' (an earlier request has it)";
  return error.rfind("line ", 0) == 0 && error.find(": duplicate id '") != std::string::npos &&
         error.size() > tail.size() && error.compare(error.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace shardlm
