// How expert-parallel exchanges carry activation rows between ranks (--ep-wire):
//   fp32  the rows as computed: every layout gives the single-rank bits (arch/expert_dispatch.h).
//   bf16  each row rounded to bf16 (nearest even) for the all-to-all and widened after it: half
//         the bytes of the dispatch rows and of the combine results (a captured dispatch's int32
//         meta goes whole, kernels/cpu/wire_bf16.h). The experts then run on the bf16 value of a
//         token's row, and each (token, expert) result is rounded once before the weighted sum,
//         whichever ranks they travel between, even to themselves: the layouts with ep > 1 give
//         each other's bits, and graph steps the eager bits. (Layouts with tp sum partial products
//         in another order, which moves the last bits; rounded, those can land on the next bf16.)
//         A layout without ep rounds nothing, so it differs by what bf16 activations make.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arch/scratch.h"

namespace shardlm {

class Communicator;

enum class ExpertWire { kF32, kBf16 };

// "fp32" or "bf16"; anything else throws naming the choices.
ExpertWire parse_expert_wire(const std::string& name);
const char* expert_wire_name(ExpertWire w);

// Bytes one block of block_len words, the first round_len of them floats, takes on the wire.
int64_t wire_block_bytes(ExpertWire w, int64_t block_len, int64_t round_len);

// The communicator's all_to_allv of float rows (counts and displacements in floats), every float
// rounded on the wire as `w` says. With bf16 the packed rows use scratch slots
// Scratch::kFeedForward + 38 and + 39.
void wire_all_to_allv(Communicator& c, Scratch& scratch, ExpertWire w, const float* send,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs, float* recv,
                      const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs);

// A fixed all-to-all queued on `stream` (a captured exchange): one block of block_len words to
// and from each rank, the first round_len of each block floats rounded as `w` says, the rest
// sent whole. Slots as wire_all_to_allv's.
void wire_enqueue_all_to_all(Communicator& c, Scratch& scratch, ExpertWire w, const float* send, float* recv,
                             int64_t block_len, int64_t round_len, void* stream);

}  // namespace shardlm
