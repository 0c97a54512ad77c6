// Hands out windows of prompt-file lines to replicas on demand, so that a faster replica takes
// more: a counter on world rank 0 advanced with MPI one-sided fetch-and-add.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <utility>

namespace shardlm {

class LineQueue {
 public:
  // Collective over MPI_COMM_WORLD: every rank constructs it, and destroys it, at matching points.
  explicit LineQueue(int64_t lines_per_claim);
  ~LineQueue();
  LineQueue(const LineQueue&) = delete;
  LineQueue& operator=(const LineQueue&) = delete;

  // The next window [first, end) of 1-based line numbers, never given to another replica.
  std::pair<int64_t, int64_t> claim();

 private:
  int64_t chunk_;
  int64_t counter_ = 0;  // lives on world rank 0; the others expose nothing
  MPI_Win win_ = MPI_WIN_NULL;
};

}  // namespace shardlm
