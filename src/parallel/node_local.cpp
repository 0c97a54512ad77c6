#include "parallel/node_local.h"

#include <mpi.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/meet_members.h"
#include "parallel/mpi_env.h"

namespace shardlm {

NodeLocal node_local(double timeout_s) {
  NodeLocal n;
  if (!MpiEnv::initialized()) return n;
  meet_world("finding the ranks of each node", timeout_s);
  const int world_rank = MpiEnv::rank(), world_size = MpiEnv::size();
  MPI_Comm shared = MPI_COMM_NULL;
  SHARDLM_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &shared) ==
                    MPI_SUCCESS,
                "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed on world rank " << world_rank);
  MPI_Comm_rank(shared, &n.local_rank);
  MPI_Comm_size(shared, &n.local_size);
  // My node's leader is the lowest world rank of my shared-memory group (the key orders it first).
  int mine = world_rank;
  MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_INT, MPI_MIN, shared);
  MPI_Comm_free(&shared);
  // Every rank learns which world rank leads its node; a node's index is the order of its leader.
  int leader = n.local_rank == 0 ? world_rank : -1;
  std::vector<int> leaders(static_cast<size_t>(world_size), -1);
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r : leaders)
    if (r >= 0) n.node_leaders.push_back(r);
  std::sort(n.node_leaders.begin(), n.node_leaders.end());
  n.nodes = static_cast<int>(n.node_leaders.size());
  n.node = static_cast<int>(std::lower_bound(n.node_leaders.begin(), n.node_leaders.end(), mine) -
                            n.node_leaders.begin());
  return n;
}

}  // namespace shardlm
