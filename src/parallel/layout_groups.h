// The communicators of one rank's groups in a layout (world, tp, pp, replica, ep, dp leaders).
#pragma once

#include <memory>
#include <string>

#include "arch/shard_plan.h"
#include "parallel/communicator.h"
#include "parallel/topology.h"

namespace shardlm {

struct LayoutGroups {
  std::unique_ptr<Communicator> world, tp, pp, replica;  // null for a group of one rank
  std::unique_ptr<Communicator> ep;          // null unless ep > 1
  std::unique_ptr<Communicator> dp_leaders;  // on dp-group leaders only, when ep > 1 and dp > 1
  ShardComms shard() const { return {tp.get(), pp.get(), replica.get(), ep.get()}; }
};

// Every rank calls it, creating the groups in the same order (world, tp, pp, replica, ep, dp leaders).
LayoutGroups make_layout_groups(const Topology& topo, const std::string& backend, double timeout_s);

}  // namespace shardlm
