// The MoE figures of a step over its pipeline stages. Each stage counts its own MoE layers (expert
// loads, all-to-all bytes and seconds); the step rows and the report want every stage's. Each
// later stage's tp rank 0 adds its figures to the sum of the stages before it (after the first)
// and sends the sum on, the last stage to the leader, which adds them to its own when the step
// ends. On the wire: E expert counts, the two byte counts and the two seconds' bits, as int64.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "arch/model.h"
#include "parallel/communicator.h"

namespace shardlm {

// The pipeline message of the sums (besides the hidden states, 11, and the logits, 12).
constexpr int kTagMoeSum = 13;

// The leader: posts the receive of the later stages' sum from the last stage into *wire.
std::unique_ptr<CommRequest> receive_later_stages_moe(Communicator& pp, int last_stage, int64_t num_experts,
                                                      std::vector<int64_t>* wire);

// A later stage (1 .. last), after its part of the step: receives the sum so far from the stage
// before (from stage 2 on), adds `own` and sends it on (the last stage to the leader, stage 0).
// `wire` is the buffer it uses.
void pass_moe_sum_on(Communicator& pp, int stage, int stages, const MoeStepStats& own, std::vector<int64_t>* wire);

// Adds figures in their wire form to s.
void add_moe_wire(const std::vector<int64_t>& wire, MoeStepStats* s);

}  // namespace shardlm
