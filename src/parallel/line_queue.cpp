#include "parallel/line_queue.h"

#include <cstdio>
#include <exception>

#include "core/error.h"
#include "parallel/meet_members.h"
#include "parallel/mpi_env.h"

namespace shardlm {

LineQueue::LineQueue(int64_t lines_per_claim, int group, int groups, double timeout_s)
    : chunk_(lines_per_claim), group_(group), groups_(groups) {
  SHARDLM_CHECK(chunk_ >= 1, "lines per claim must be >= 1");
  SHARDLM_CHECK(groups_ >= 1 && group_ >= 0 && group_ < groups_,
                "engine group " << group_ << " is not one of " << groups_);
  meet_world("creating the prompt-line queue", timeout_s);
  const bool holder = MpiEnv::rank() == 0;
  const int rc = MPI_Win_create(holder ? &counter_ : nullptr, holder ? sizeof counter_ : 0, sizeof counter_,
                                MPI_INFO_NULL, MPI_COMM_WORLD, &win_);
  if (rc != MPI_SUCCESS) {
    win_ = MPI_WIN_NULL;
    why_ = MpiEnv::error_text(rc);
  }
  // Every rank must take the same way: a window some ranks hold and others do not can be neither
  // used nor freed.
  int here = rc == MPI_SUCCESS ? 1 : 0, made = 0;
  MPI_Allreduce(&here, &made, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  SHARDLM_CHECK(made == 0 || made == MpiEnv::size(), "creating the work-queue window failed on some ranks only ("
                                                         << (here ? "not here" : "here: " + why_) << ")");
  if (!on_demand() && holder) {
    std::fprintf(stderr,
                 "[shardlm] warning: MPI cannot create the one-sided window of the prompt-line queue (%s); the %d "
                 "replicas take windows of %lld lines in turn instead of as they finish them\n",
                 why_.c_str(), groups_, static_cast<long long>(chunk_));
  }
}

// MPI_Win_free is collective: while an error unwinds this rank the others may never get there, and
// the job is being aborted anyway, so the window is left to MPI_Abort.
LineQueue::~LineQueue() {
  if (win_ != MPI_WIN_NULL && std::uncaught_exceptions() == 0) MPI_Win_free(&win_);
}

std::pair<int64_t, int64_t> LineQueue::claim() {
  int64_t before = 0;
  if (!on_demand()) {
    before = (counter_++ * groups_ + group_) * chunk_;
    return {before + 1, before + 1 + chunk_};
  }
  int rc = MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win_);
  if (rc == MPI_SUCCESS) rc = MPI_Fetch_and_op(&chunk_, &before, MPI_INT64_T, 0, 0, MPI_SUM, win_);
  if (rc == MPI_SUCCESS) rc = MPI_Win_unlock(0, win_);
  SHARDLM_CHECK(rc == MPI_SUCCESS,
                "claiming prompt lines from the work queue on rank 0 failed (" << MpiEnv::error_text(rc) << ")");
  return {before + 1, before + 1 + chunk_};
}

}  // namespace shardlm
