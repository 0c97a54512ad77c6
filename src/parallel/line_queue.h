// Hands out windows of prompt-file lines to replicas (engine groups) on demand, so that a faster
// replica takes more: a counter on world rank 0 advanced with MPI one-sided fetch-and-add. Where
// the MPI library cannot create the window (an Open MPI whose one-sided components all decline the
// transports at hand: seen with two ranks on one host whose single-copy path is unavailable), the
// windows go to the replicas in turn instead, group g taking windows g, g + groups, ...: every
// line is still read by exactly one replica, only the balancing is lost, and rank 0 says so.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>

namespace shardlm {

class LineQueue {
 public:
  // Collective over MPI_COMM_WORLD: every rank constructs it, and destroys it, at matching points;
  // one that does not come to the construction within timeout_s is named in an Error (<= 0: no
  // deadline). `group` is this rank's engine group of `groups`.
  LineQueue(int64_t lines_per_claim, int group, int groups, double timeout_s);
  ~LineQueue();
  LineQueue(const LineQueue&) = delete;
  LineQueue& operator=(const LineQueue&) = delete;

  // The next window [first, end) of 1-based line numbers, never given to another replica. Called by
  // one rank per engine group.
  std::pair<int64_t, int64_t> claim();

  // False when the windows go round-robin (no one-sided window).
  bool on_demand() const { return win_ != MPI_WIN_NULL; }

 private:
  int64_t chunk_;
  int group_, groups_;
  int64_t counter_ = 0;  // on world rank 0 the shared counter; round-robin, this group's claims so far
  MPI_Win win_ = MPI_WIN_NULL;
  std::string why_;  // MPI's error when the window could not be made
};

}  // namespace shardlm
