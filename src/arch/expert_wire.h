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
#include "compute/backend.h"

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

// Bytes one row of row_len floats takes on wire w.
int64_t wire_row_bytes(ExpertWire w, int64_t row_len);

// An eager exchange's rows, moved onto the wire and off it in one pass each (the gather and the
// packing fused; fp32 is a plain gather_rows):
//   pack     dst: n wire rows of wire_row_bytes(w, H), row i src row rows[i] ([*, H] floats);
//   unpack   dst [n, H] floats: row i the wire row rows[i] of src, read back (and dst's twin,
//            where it has one, in the same pass);
//   combine  the backend's combine_rows on wire rows y (fp32 or bf16: a combine's wire).
// Zeros where rows[i] < 0 (fp8: a zero row, scales 1).
void pack_wire_rows(ComputeBackend& b, ExpertWire w, const float* src, int64_t H, const int32_t* rows, int64_t n,
                    void* dst);
void unpack_wire_rows(ComputeBackend& b, ExpertWire w, const void* src, int64_t H, const int32_t* rows, int64_t n,
                      ActivationsOut dst);
void combine_wire_rows(ComputeBackend& b, ExpertWire w, const void* y, int64_t H, const int32_t* token_start,
                       const int32_t* rows, const float* weights, int64_t T, float* out);

// The communicator's all_to_allv of whole rows of H floats on wire w, packed (counts and
// displacements in rows).
void wire_rows_all_to_allv(Communicator& c, ExpertWire w, int64_t H, const void* send,
                           const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs, void* recv,
                           const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs);

// A fixed all-to-all queued on `stream` (a captured exchange): one block of block_len words to
// and from each rank, the first round_len of each block floats (rows of row_len) on the wire as
// `w` says, the rest sent whole. The packed blocks use scratch slots Scratch::kFeedForward + 38 and
// + 39.
void wire_enqueue_all_to_all(Communicator& c, Scratch& scratch, ExpertWire w, const float* send, float* recv,
                             int64_t block_len, int64_t round_len, int64_t row_len, void* stream);
// The same for blocks of rows only, each gathered onto the wire as it is packed: block p's row q
// is src row rows[p * rows_per_block + q] (pack_wire_rows). Returns the received blocks as they
// came (c.size() * rows_per_block wire rows), for expert_combine_wire to read. Slots as above.
const void* wire_enqueue_rows_all_to_all(Communicator& c, Scratch& scratch, ExpertWire w, const float* src, int64_t H,
                                         const int32_t* rows, int64_t rows_per_block, void* stream);
// The backend's expert_combine on wire rows yp (fp32 or bf16: a combine's wire).
void expert_combine_wire(ComputeBackend& b, ExpertWire w, const void* yp, int64_t H, const int32_t* ids,
                         const float* weights, const int32_t* slot_row, int64_t T, int64_t k, float* out);

}  // namespace shardlm
