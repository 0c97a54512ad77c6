// Error type and check macros shared by every module.
//
// A failed check throws shardlm::Error carrying file:line; the top level (src/cli/main.cpp) adds
// rank and host and, in an MPI job, aborts the whole job so that no rank is left waiting in a
// collective. Library code never calls exit().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace shardlm {

class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, const char* file, int line)
      : std::runtime_error(msg), file_(file), line_(line) {}
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  const char* file_;
  int line_;
};

namespace detail {
[[noreturn]] inline void throw_error(const std::string& msg, const char* file, int line) {
  throw Error(msg, file, line);
}
}  // namespace detail

}  // namespace shardlm

// SHARDLM_CHECK(cond, "message " << value): throws shardlm::Error when cond is false.
#define SHARDLM_CHECK(cond, stream_expr)                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::ostringstream shardlm_check_os_;                                       \
      shardlm_check_os_ << stream_expr;                                           \
      ::shardlm::detail::throw_error(shardlm_check_os_.str(), __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

#define SHARDLM_FAIL(stream_expr) SHARDLM_CHECK(false, stream_expr)
