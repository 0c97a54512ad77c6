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
//   fp8   the dispatch rows quantised to fp8 e4m3 with a scale per 128 values (DeepEP's dispatch
//         format, the W8A8 GEMMs' activation quantisation: kernels/cpu/wire_fp8.h), about a
//         quarter of their fp32 bytes; the combine results in bf16 as above. Each token's row is
//         quantised once on its way to the experts, whichever ranks it travels between, so the
//         layouts with ep > 1 give each other's bits as with bf16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arch/scratch.h"

namespace shardlm {

class Communicator;

enum class ExpertWire { kF32, kBf16, kFp8 };

// "fp32", "bf16" or "fp8"; anything else throws naming the choices.
ExpertWire parse_expert_wire(const std::string& name);
const char* expert_wire_name(ExpertWire w);

// How the combine's results travel on wire w: fp8 sends them in bf16, as DeepEP's combine does.
ExpertWire combine_wire(ExpertWire w);

// Bytes one block of block_len words takes on the wire: its first round_len words floats, rows of
// row_len for fp8, the rest whole words.
int64_t wire_block_bytes(ExpertWire w, int64_t block_len, int64_t round_len, int64_t row_len);

// The communicator's all_to_allv of rows of row_len floats (counts and displacements in floats,
// multiples of row_len), every row on the wire as `w` says. With bf16 or fp8 the packed rows use
// scratch slots Scratch::kFeedForward + 38 and + 39.
void wire_all_to_allv(Communicator& c, Scratch& scratch, ExpertWire w, int64_t row_len, const float* send,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs, float* recv,
                      const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs);

// A fixed all-to-all queued on `stream` (a captured exchange): one block of block_len words to
// and from each rank, the first round_len of each block floats (rows of row_len) on the wire as
// `w` says, the rest sent whole. Slots as wire_all_to_allv's.
void wire_enqueue_all_to_all(Communicator& c, Scratch& scratch, ExpertWire w, const float* send, float* recv,
                             int64_t block_len, int64_t round_len, int64_t row_len, void* stream);

}  // namespace shardlm
