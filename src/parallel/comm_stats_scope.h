// Pieces the communicator backends share: byte offsets into untyped buffers, and the scope that
// adds a call's bytes and wall time to CommStats when the call returns normally (not when it
// throws: a failed call is reported, not counted).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>

#include "parallel/communicator.h"

namespace shardlm::comm_detail {

inline const char* cat(const void* p, size_t elems, size_t es) { return static_cast<const char*>(p) + elems * es; }
inline char* at(void* p, size_t elems, size_t es) { return static_cast<char*>(p) + elems * es; }

class StatScope {
 public:
  using Clock = std::chrono::steady_clock;
  StatScope(CommStats& s, uint64_t bytes)
      : s_(s), bytes_(bytes), t0_(Clock::now()), exceptions_(std::uncaught_exceptions()) {}
  ~StatScope() {
    if (std::uncaught_exceptions() > exceptions_) return;  // this call threw
    s_.calls += 1;
    s_.bytes_sent += bytes_;
    s_.seconds += std::chrono::duration<double>(Clock::now() - t0_).count();
  }
  StatScope(const StatScope&) = delete;
  StatScope& operator=(const StatScope&) = delete;

 private:
  CommStats& s_;
  uint64_t bytes_;
  Clock::time_point t0_;
  int exceptions_;
};

// The wait of a nonblocking send or receive (CommRequest::wait): its wall time is the call's too
// (the posting counted the call and its bytes), so a blocking send or receive counts its wait.
class WaitScope {
 public:
  using Clock = std::chrono::steady_clock;
  explicit WaitScope(CommStats& s) : s_(s), t0_(Clock::now()), exceptions_(std::uncaught_exceptions()) {}
  ~WaitScope() {
    if (std::uncaught_exceptions() > exceptions_) return;  // the wait threw
    s_.seconds += std::chrono::duration<double>(Clock::now() - t0_).count();
  }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  CommStats& s_;
  Clock::time_point t0_;
  int exceptions_;
};

}  // namespace shardlm::comm_detail
