// Where this rank sits on its node: ranks that share a host (MPI_COMM_TYPE_SHARED), numbered by
// world rank. Used to bind a rank to a GPU and to pick one rank per node for node-level reports.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

struct NodeLocal {
  int local_rank = 0;   // rank among the ranks of this node
  int local_size = 1;   // ranks on this node
  int node = 0;         // index of this node (nodes numbered by their lowest world rank)
  int nodes = 1;        // nodes in the job
  std::vector<int> node_leaders;  // world rank of each node's local rank 0, by node index
};

// Collective over MPI_COMM_WORLD (every rank calls it). The ranks meet first (meet_members.h): one
// that does not come within timeout_s is named in an Error (<= 0: no deadline). Without MPI (not
// initialised) it returns the single-process answer.
NodeLocal node_local(double timeout_s);

}  // namespace shardlm
