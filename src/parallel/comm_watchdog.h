// The second line behind a communicator's own deadline: ends the job when one of its calls has
// been inside the transport for well past the deadline, the case where the deadline check itself
// cannot run because the calling thread never comes back from the transport. Seen with libfabric's
// shm provider: a send spins on a lock in shared memory that a stopped (SIGSTOP) peer holds, and
// the communicator's wait loop, which would time out and name the peer, never gets control again.
//
// A communicator owns one CommWatchdog; around each call into its transport it holds a Busy mark
// (two atomic stores, no lock, so the mark costs nothing on a microsecond collective). One thread
// per process looks at every live watchdog ten times a second and, for a mark older than its
// limit, prints the watchdog's description of the call (the same "op on group ... timed out after
// ... ; peers: ..." text the communicator's own timeout gives) and aborts the job.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace shardlm {

class CommWatchdog {
 public:
  // describe(op) is the abort message for a call to `op` stuck past limit_s, from the watchdog's
  // thread: it may read only what does not change while the communicator lives. limit_s <= 0:
  // nothing is watched.
  CommWatchdog(double limit_s, std::function<std::string(const char* op)> describe);
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  // Marks the watchdog's communicator as inside `op` from construction to destruction. Inside an
  // outer mark an inner one changes nothing: the outer call's start and name stand.
  class Busy {
   public:
    Busy(CommWatchdog& w, const char* op);
    ~Busy();
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    CommWatchdog& w_;
    int64_t since_;
    const char* op_;
  };

  // The limit a communicator with deadline timeout_s gives its watchdog: twice the deadline, and
  // at least 2 s more, so the communicator's own timeout (with its list of pending peers) always
  // fires first when it can.
  static double limit_for(double timeout_s);

 private:
  friend class WatchdogThread;
  const double limit_s_;
  const std::function<std::string(const char*)> describe_;
  std::atomic<int64_t> since_ns_{0};  // steady-clock ns when the current mark began; 0: idle
  std::atomic<const char*> op_{nullptr};
};

}  // namespace shardlm
