// Every rank's op profile (compute/op_profile.h) gathered for /op_profile of the result file.
#pragma once

#include <vector>

#include "compute/op_profile.h"

namespace shardlm {

class Communicator;

// Every rank's rows, in world-rank order, on every rank (a collective over world; null: a one-rank
// job, whose rows come back as they are). Each row's rank is the world rank that sent it.
std::vector<OpProfileRow> gather_op_profile_rows(Communicator* world, const std::vector<OpProfileRow>& mine);

}  // namespace shardlm
