#include "parallel/line_queue.h"

#include <exception>

#include "core/error.h"
#include "parallel/mpi_env.h"

namespace shardlm {

LineQueue::LineQueue(int64_t lines_per_claim) : chunk_(lines_per_claim) {
  SHARDLM_CHECK(chunk_ >= 1, "lines per claim must be >= 1");
  const bool holder = MpiEnv::rank() == 0;
  const int rc = MPI_Win_create(holder ? &counter_ : nullptr, holder ? sizeof counter_ : 0, sizeof counter_,
                                MPI_INFO_NULL, MPI_COMM_WORLD, &win_);
  SHARDLM_CHECK(rc == MPI_SUCCESS, "creating the work-queue window failed (MPI error " << rc << ")");
}

// MPI_Win_free is collective: while an error unwinds this rank the others may never get there, and
// the job is being aborted anyway, so the window is left to MPI_Abort.
LineQueue::~LineQueue() {
  if (win_ != MPI_WIN_NULL && std::uncaught_exceptions() == 0) MPI_Win_free(&win_);
}

std::pair<int64_t, int64_t> LineQueue::claim() {
  int64_t before = 0;
  int rc = MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win_);
  if (rc == MPI_SUCCESS) rc = MPI_Fetch_and_op(&chunk_, &before, MPI_INT64_T, 0, 0, MPI_SUM, win_);
  if (rc == MPI_SUCCESS) rc = MPI_Win_unlock(0, win_);
  SHARDLM_CHECK(rc == MPI_SUCCESS, "claiming prompt lines from the work queue on rank 0 failed (MPI error " << rc << ")");
  return {before + 1, before + 1 + chunk_};
}

}  // namespace shardlm
