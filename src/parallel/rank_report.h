// Per-rank facts (coordinates, host, load, memory, traffic) gathered to every rank for /ranks and
// the run header.
#pragma once

#include <vector>

#include "io/result_writer.h"

namespace shardlm {

class Communicator;

// Peak resident memory of this process, bytes.
int64_t peak_rss_bytes();
// Numbers the ranks of each host 0, 1, ... in world-rank order (the device each would use).
void assign_local_ranks(std::vector<RankRecord>* ranks);
// Every rank's record, in world-rank order (world may be null for a one-rank job), local ranks set.
std::vector<RankRecord> gather_rank_records(Communicator* world, const RankRecord& mine);

}  // namespace shardlm
