#include "parallel/layout_groups.h"

namespace shardlm {

LayoutGroups make_layout_groups(const Topology& topo, const std::string& backend, double timeout_s) {
  LayoutGroups g;
  // The groups that move activations use the chosen backend: tp (the collectives and the
  // vocabulary gather), pp (hidden states between stages) and ep (the MoE all-to-all). With nccl
  // the pp group's other messages, the step's choices or logits sent back to the leader, are host
  // buffers and so travel on the NCCL communicator's inner MPI one: the leader's receive posted
  // before its hidden-state send is never queued behind it on NCCL's stream. The world, replica
  // and dp-leader groups carry only host control messages and stay on MPI with every backend.
  const std::string host_backend = "mpi";
  const Coords& c = topo.coords();
  const std::string where = "replica " + std::to_string(c.replica);
  // tp and pp groups are per dp group: their names say which when there are several.
  const std::string dp_part = topo.layout().dp > 1 ? ", dp " + std::to_string(c.dp) : "";
  std::vector<int> all(static_cast<size_t>(topo.layout().world()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  if (all.size() > 1) g.world = make_communicator(host_backend, all, "world", timeout_s);
  if (topo.layout().tp > 1) {
    g.tp = make_communicator(backend, topo.tp_group(),
                             "tp(" + where + dp_part + ", stage " + std::to_string(c.pp) + ")", timeout_s);
  }
  if (topo.layout().pp > 1) {
    g.pp = make_communicator(backend, topo.pp_group(), "pp(" + where + dp_part + ", tp " + std::to_string(c.tp) + ")",
                             timeout_s);
  }
  const std::string group_name = topo.layout().dp > 1 ? where + " dp " + std::to_string(c.dp) : where;
  if (topo.replica_group().size() > 1) g.replica = make_communicator(host_backend, topo.replica_group(), group_name, timeout_s);
  if (topo.layout().ep > 1) {
    g.ep = make_communicator(backend, topo.ep_group(), "ep(" + where + ", stage " + std::to_string(c.pp) + ")",
                             timeout_s);
    if (topo.layout().dp > 1 && topo.is_replica_leader()) {
      g.dp_leaders = make_communicator(host_backend, topo.dp_leaders(), "dp leaders(" + where + ")", timeout_s);
    }
  }
  return g;
}

}  // namespace shardlm
