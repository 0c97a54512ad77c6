// The figures of a step over its pipeline stages. Each stage knows only its own part: the seconds
// its tp rank 0 spent computing and communicating, and, for MoE models, its MoE layers' expert
// loads, all-to-all bytes and seconds. The step rows and the report want every stage's. Each later
// stage's tp rank 0 receives the figures so far from the stage before (from stage 2 on), adds its
// own and sends them on, the last stage to the leader, which adds its own when the step ends.
// On the wire (int64): E expert counts, the two MoE byte counts and the two MoE seconds' bits
// (summed over the stages), then each stage's compute and communication seconds' bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "arch/model.h"
#include "parallel/communicator.h"

namespace shardlm {

// The pipeline message of the figures (besides the hidden states, 11, and the logits, 12).
constexpr int kTagStageFigures = 13;

// The leader: posts the receive of the later stages' figures from the last stage into *wire.
// num_experts: 0 for dense models.
std::unique_ptr<CommRequest> receive_later_stages(Communicator& pp, int stages, int64_t num_experts,
                                                  std::vector<int64_t>* wire);

// A later stage (1 .. last), after its part of the step: receives the figures so far from the stage
// before (from stage 2 on), adds its own (own_moe: null for dense models) and sends them on (the
// last stage to the leader, stage 0). `wire` is the buffer it uses.
void pass_figures_on(Communicator& pp, int stage, int stages, const MoeStepStats* own_moe, StageSeconds own,
                     std::vector<int64_t>* wire);

// The received figures: the later stages' MoE sums added to *moe (null for dense models), and
// stages 1 .. S-1 of *stages (resized to S) set; stage 0's entry is left as it was.
void read_later_stages(const std::vector<int64_t>& wire, int stages, MoeStepStats* moe,
                       std::vector<StageSeconds>* seconds);

}  // namespace shardlm
