#include "parallel/meet_members.h"

#include <mpi.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "parallel/mpi_env.h"

namespace shardlm {

void meet_members(const std::vector<int>& members, int rank, const std::string& what, double timeout_s) {
  // On the control communicator, whose messages nothing else receives.
  const MPI_Comm ctl = MpiEnv::control_comm();
  if (ctl == MPI_COMM_NULL || timeout_s <= 0 || members.size() < 2) return;
  using Clock = std::chrono::steady_clock;
  constexpr int kTag = 7;
  const size_t n = members.size();
  int token = 1;
  std::vector<int> got(n, 0);
  std::vector<MPI_Request> reqs;
  // Waits for reqs, polling; on the deadline names the members whose request has not completed.
  auto wait = [&](const std::vector<int>& peers, const char* how) {
    const auto t0 = Clock::now();
    std::vector<int> done(reqs.size(), 0);
    for (;;) {
      bool all = true;
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (!done[i]) MPI_Test(&reqs[i], &done[i], MPI_STATUS_IGNORE);
        all = all && done[i];
      }
      if (all) return;
      if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) {
        std::string missing;
        for (size_t i = 0; i < reqs.size(); ++i)
          if (!done[i]) missing.append(" ").append(std::to_string(peers[i]));
        SHARDLM_FAIL(what << ": " << how << " world rank(s)" << missing << " for " << timeout_s
                          << " s (stuck or not started before it; raise --comm-timeout if they were only slow)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  std::vector<int> peers;
  if (rank == 0) {
    for (size_t i = 1; i < n; ++i) {
      reqs.emplace_back();
      peers.push_back(members[i]);
      MPI_Irecv(&got[i], 1, MPI_INT, members[i], kTag, ctl, &reqs.back());
    }
    wait(peers, "no word from");
    reqs.clear();
    for (size_t i = 1; i < n; ++i) {
      reqs.emplace_back();
      MPI_Isend(&token, 1, MPI_INT, members[i], kTag, ctl, &reqs.back());
    }
    wait(peers, "no answer from");
  } else {
    peers = {members[0], members[0]};
    reqs.resize(2);
    MPI_Isend(&token, 1, MPI_INT, members[0], kTag, ctl, &reqs[0]);
    MPI_Irecv(&got[0], 1, MPI_INT, members[0], kTag, ctl, &reqs[1]);
    wait(peers, "no word from the group's first member,");
  }
}

void meet_world(const std::string& what, double timeout_s) {
  if (!MpiEnv::initialized()) return;
  std::vector<int> all(static_cast<size_t>(MpiEnv::size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  meet_members(all, MpiEnv::rank(), what, timeout_s);
}

}  // namespace shardlm
