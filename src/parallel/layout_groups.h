// The communicators of one rank's groups in a layout (world, tp, pp, replica).
#pragma once

#include <memory>
#include <string>

#include "arch/shard_plan.h"
#include "parallel/communicator.h"
#include "parallel/topology.h"

namespace shardlm {

struct LayoutGroups {
  std::unique_ptr<Communicator> world, tp, pp, replica;  // null for a group of one rank
  ShardComms shard() const { return {tp.get(), pp.get(), replica.get()}; }
};

// Every rank calls it, creating the groups in the same order (world, tp, pp, replica).
LayoutGroups make_layout_groups(const Topology& topo, const std::string& backend, double timeout_s);

}  // namespace shardlm
