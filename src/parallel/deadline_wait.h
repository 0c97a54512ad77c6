// The wait loop of the device communicators: poll until done, with a deadline. NCCL work runs
// asynchronously on a stream, so a peer that died or never joined shows up only as a stream that
// never finishes (or an asynchronous error); this loop turns both into an Error naming the
// operation, the group, this rank, its world rank and host, after aborting the communicator (so
// that the kernels waiting on the dead peer are torn down and the top level can end the job).
//
// Templated on the poll and abort functions so that the loop is tested without a GPU.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "core/error.h"

namespace shardlm {

enum class PollState { kPending, kDone, kFailed };

struct PollResult {
  PollState state = PollState::kPending;
  std::string error;  // kFailed: what went wrong (the NCCL or CUDA error text)
};

// Who is waiting, for the error message.
struct WaitContext {
  std::string op;         // "all_reduce", "ncclCommInitRankConfig", ...
  std::string group;      // communicator name
  int rank = 0;           // rank in the group
  int world_rank = 0;
  std::string host;
  double timeout_s = 0;   // <= 0: no deadline
  std::string peers;      // "world ranks 1, 2"; may be empty
};

namespace detail {
inline std::string wait_where(const WaitContext& c) {
  return "on rank " + std::to_string(c.rank) + " (world rank " + std::to_string(c.world_rank) + ", host " + c.host + ")";
}
}  // namespace detail

// Calls poll() until it returns kDone. kFailed, or the deadline passing, calls abort() once and
// throws Error. Spins (yielding the core) for the first 2 ms, which covers small collectives
// without adding sleep latency, then sleeps in steps of 50 to 500 us.
template <typename Poll, typename Abort>
void wait_with_deadline(const WaitContext& c, Poll&& poll, Abort&& abort) {
  using Clock = std::chrono::steady_clock;
  constexpr double kSpinSeconds = 2e-3;
  const auto t0 = Clock::now();
  int sleep_us = 50;
  for (;;) {
    PollResult r = poll();
    if (r.state == PollState::kDone) return;
    if (r.state == PollState::kFailed) {
      abort();
      SHARDLM_FAIL(c.op << " on group " << c.group << " failed " << detail::wait_where(c) << ": " << r.error
                        << (c.peers.empty() ? "" : "; peers: " + c.peers) << " (communicator aborted)");
    }
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (c.timeout_s > 0 && waited > c.timeout_s) {
      abort();
      SHARDLM_FAIL(c.op << " on group " << c.group << " timed out after " << c.timeout_s << " s "
                        << detail::wait_where(c) << (c.peers.empty() ? "" : "; peers: " + c.peers)
                        << " (communicator aborted)");
    }
    if (waited < kSpinSeconds) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 500);
    }
  }
}

}  // namespace shardlm
