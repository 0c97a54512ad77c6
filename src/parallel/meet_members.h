// A deadline in front of an MPI call that would wait for a missing rank for ever (creating a
// communicator, splitting the world, creating a one-sided window): the members meet first on the
// control communicator, and a member stuck before the meeting (in a device's setup, in reading a
// file) ends the others' wait with an error that names it, instead of a silent hang.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

// Every world rank in `members` (this one is members[rank]) has come here, or this throws Error
// "<what>: no word from world rank(s) ... for T s" after timeout_s. Member 0 hears from each, then
// lets each go. Every member calls it at the same point of its program, in the same order as its
// peers, so the messages of two meetings never cross. No-op without MPI or with timeout_s <= 0.
void meet_members(const std::vector<int>& members, int rank, const std::string& what, double timeout_s);

// meet_members over the whole world.
void meet_world(const std::string& what, double timeout_s);

}  // namespace shardlm
