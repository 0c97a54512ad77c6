// The error row a run writes for a request whose id another request of the file has, when the
// other one reached the writer first (cli/run_sinks.h): the file then holds that id's output once. shardlm merge
// recognises such a row beside the first one of its input and copies both, as the run wrote them.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

// The row of the id that finished first keeps the output, whichever line it came from.
constexpr const char* kDuplicateIdWhy = " (another request of the file has it; the first to finish is kept)";
// What files written before said instead, still recognised.
constexpr const char* kDuplicateIdWhyBefore = " (an earlier request has it)";

inline std::string duplicate_id_error(int64_t line, const std::string& id) {
  return "line " + std::to_string(line) + ": duplicate id '" + id + "'" + kDuplicateIdWhy;
}

namespace detail {
inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace detail

// Whether `error` is such a row's, for the id (whatever its line).
inline bool is_duplicate_id_error(const std::string& error, const std::string& id) {
  const std::string head = ": duplicate id '" + id + "'";
  return error.rfind("line ", 0) == 0 &&
         (detail::ends_with(error, head + kDuplicateIdWhy) || detail::ends_with(error, head + kDuplicateIdWhyBefore));
}

// Whether `error` is such a row's, for any id.
inline bool is_duplicate_id_error(const std::string& error) {
  return error.rfind("line ", 0) == 0 && error.find(": duplicate id '") != std::string::npos &&
         (detail::ends_with(error, std::string("'") + kDuplicateIdWhy) ||
          detail::ends_with(error, std::string("'") + kDuplicateIdWhyBefore));
}

}  // namespace shardlm
