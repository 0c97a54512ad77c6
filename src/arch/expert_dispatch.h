// Expert-parallel dispatch and combine of one MoE layer over the ep communicator. The activation
// rows stay in backend memory (on the CUDA backend with --comm nccl the all-to-alls of rows run in
// NCCL on device buffers); the index work is done on the host from the routing ([T, k] ids and
// weights, small), and the backend's gather_rows / combine_rows move the rows by the uploaded maps.
//
// The routed experts are spread over the ep group in contiguous ranges: with E experts and ep
// ranks, rank r owns experts [r * E/ep, (r + 1) * E/ep). One step goes:
//
//   dispatch  every rank sends each of its tokens once to every rank owning at least one of the
//             token's experts: a record of the hidden row (H floats) and the local indices of the
//             experts it is for (min(k, E/ep) int32 slots, -1 padded). A token routed to two
//             experts of the same rank travels once and is used twice. The record counts go
//             first (all_to_all, host), then the records' rows (all_to_allv of floats, backend
//             memory) and their slots (all_to_allv of int32, host): two calls, so that neither
//             mixes host and device buffers. Records to one rank are in ascending token order.
//             The owner gathers the rows per local expert: rows [offsets[e], offsets[e+1]) of
//             input() are expert e's, ordered (source rank, record), so each expert runs as plain
//             GEMMs on contiguous rows.
//   experts   the caller fills output() ([R, H], same order as input()), e.g. with run_experts
//             (arch/expert_ffn.h).
//   combine   the results go back by the reverse all_to_allv, one row per (token, expert) pair (not
//             pre-summed at the owner), ordered per source by (local expert, record), which is the
//             source's own (expert, token) pair order; the token's rank sums them with the routing
//             weights in ascending global expert index:  out[t] = sum over e of w(t,e) * y_e(x_t).
//
// Because each (token, expert) result comes back unsummed and the sum runs in a fixed order with
// expert_combine's rounding, and the matmul is batch invariant (a row's bits do not depend on the
// other rows of the GEMM), the combined output is bit-identical whatever the expert-parallel
// layout, and identical to the single-rank path (ep null or of size 1: nothing travels, the same
// gather and the same sum). The price is combine bytes: one row per pair instead of one per
// (token, rank).
//
// Every rank of the group must call dispatch and combine for every step, with T = 0 when it has
// no tokens, so that the all-to-alls pair up. The row buffers handed to the communicator are
// never null (a zero-size step passes a one-float scratch buffer), so every member passes device
// memory to the row calls and host memory to the count and slot calls.
//
// On a bf16 or fp8 wire the rows are gathered straight onto the wire and read back off it as the
// owner gathers them per expert, and the combine sums the bf16 results where they arrive
// (arch/expert_wire.h pack_wire_rows): no fp32 copy of a row is made for the exchange. The owner's
// gather writes the rows' bf16 twin in the same pass where the caller asks for one, so that
// experts whose GEMMs read bf16 activations do not cast them again.
//
// Backend memory comes from the caller's Scratch: slots Scratch::kFeedForward + 20 .. + 29 and
// + 41 (the twin), valid from dispatch until the next dispatch (input() and output() included).
#pragma once

#include <cstdint>
#include <vector>

#include "arch/expert_ffn.h"
#include "arch/expert_wire.h"
#include "arch/moe_router.h"
#include "arch/scratch.h"
#include "compute/backend.h"

namespace shardlm {

class Communicator;

class ExpertDispatch {
 public:
  // ep: the expert-parallel group (null: one rank holding every expert).
  ExpertDispatch(Communicator* ep, int64_t num_experts, int64_t hidden);

  // Sends this rank's T rows x [T, H] (backend memory) to the owners of their routed experts and
  // gathers what this rank's experts must run. `r` (host) holds T tokens. The rows travel, and the
  // results come back in combine, as `wire` says (arch/expert_wire.h; nothing travels without ep).
  // input() gets a bf16 twin when rows() <= twin_rows and the backend wants twins.
  void dispatch(Scratch& scratch, const float* x, const Routing& r, ExpertWire wire = ExpertWire::kF32,
                int64_t twin_rows = 0);
  // After dispatch: rows this rank's experts run, grouped per local expert.
  int64_t rows() const { return offsets_.back(); }
  const std::vector<int64_t>& offsets() const { return offsets_; }  // [local experts + 1], host
  Activations input() const { return {input_, input_twin_}; }       // [rows(), H], backend memory
  float* output() { return output_; }                              // [rows(), H], filled by the caller
  // Returns the results to the tokens' ranks and writes out [out_rows, H] (backend memory;
  // overwritten): row first + t is token t's combined result, every other row zero.
  void combine(Scratch& scratch, float* out, int64_t out_rows, int64_t first);
  void combine(Scratch& scratch, float* out) { combine(scratch, out, T_, 0); }

  int64_t local_experts() const { return per_rank_; }
  int64_t first_local_expert() const { return static_cast<int64_t>(rank_) * per_rank_; }

  // Figures of the last dispatch and combine: wall seconds from the backend being idle to the
  // phase's work being complete (index building, uploads, exchanges and row movement included),
  // and bytes this rank sent to other ranks (rows and slots; its own share and the count exchange
  // not included).
  double dispatch_seconds = 0, combine_seconds = 0;
  int64_t dispatch_bytes = 0, combine_bytes = 0;

 private:
  Communicator* ep_;
  int rank_ = 0, size_ = 1;
  int64_t E_, H_, per_rank_;
  int64_t T_ = 0, k_ = 0;
  ExpertWire wire_ = ExpertWire::kF32;

  // This rank's (token, expert) pairs in ascending (expert, token) order: the order results come
  // back in (recv_res row i is pair i).
  std::vector<int64_t> pairs_to_;  // [size] pairs this rank sends to each owner
  // The combine's map, per token in ascending expert order: pair indices and their weights.
  std::vector<int32_t> token_start_, token_pairs_;  // [T + 1], [T * k]
  std::vector<float> token_weights_;                // [T * k]

  // Owner side.
  std::vector<int64_t> offsets_;     // [per_rank + 1] rows per local expert
  std::vector<int64_t> from_cnt_;    // [size * per_rank] pairs received from s for local expert e
  std::vector<int64_t> pairs_from_;  // [size] pairs received from each rank
  float* input_ = nullptr;           // scratch, [rows, H]
  uint16_t* input_twin_ = nullptr;   // scratch, [rows, H], or null
  float* output_ = nullptr;          // scratch, [rows, H]

  // input()'s twin buffer for `rows` rows, or null (see dispatch).
  uint16_t* twin(Scratch& scratch, int64_t rows, int64_t twin_rows) const;

  // Host index arrays (uploaded) and the slot exchange.
  std::vector<int32_t> send_rows_, input_rows_, result_rows_;
  std::vector<int32_t> send_slots_, recv_slots_;
};

}  // namespace shardlm
