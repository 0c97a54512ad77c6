// Expert-parallel dispatch and combine of one MoE layer in a captured step (CUDA graphs): the same
// exchange as expert_dispatch.h, but with message sizes fixed by the step's row count, so that no
// count is read on the host and the whole layer (routing, index plans, NCCL all-to-alls queued on
// the captured stream, the experts' GEMMs) replays from a graph.
//
// Every rank of the ep group reserves, per peer, a block of C records going out (their rows, then
// their meta in rows of its own, so that one all-to-all carries both) and a block of Cc result
// rows coming back (kernels/cpu/expert_exchange.h defines the blocks and the index plans built on
// the device): two all-to-alls a layer. Shares are at most S = ceil(T / tp) tokens; a token goes
// at most once to each owner and makes there at most kl = min(k, experts per rank) pairs, so with
// m = S * k / ep, the mean pairs of a block, and f the capacity factor (--ep-graph-capacity):
//   C  = min(S, ceil(f * (m + 1))),   Cc = min(S * kl, ceil(f * (m + kl)))
// that is f times the mean plus one token's worth: small steps (decode of a few sequences) get the
// worst case, C = S and Cc = S * kl, which never overflows, and large ones f times the mean, not
// ep times it; f = 0 takes the worst case always. A block that would overflow keeps its first
// records and pairs and raises the step's overflow flag; the decoder then redoes the step
// eagerly, so a result is never short of a pair (/ranks/graph_reruns counts such steps).
//
// The arithmetic is the eager exchange's: each (token, expert) result comes back unsummed and
// expert_combine sums them in ascending expert id with the same rounding, and the owner runs its
// rows through grouped_linear_routed (batch invariant per row), as an eager step with few rows per
// expert does, so a decode step gives the eager expert-parallel step's bits and the single-rank
// step's.
//
// Scratch slots Scratch::kFeedForward + 30 .. + 40 (+ 38 and + 39 for the packed rows, + 40 for
// the owner's rows' twin), valid from dispatch until the next dispatch.
#pragma once

#include <cstdint>

#include "arch/expert_wire.h"
#include "arch/scratch.h"
#include "compute/backend.h"
#include "cpu/expert_exchange.h"

namespace shardlm {

class Communicator;

// The blocks of a step of T rows of `hidden` floats (the same on every rank of the group).
cpu::ExchangeShape exchange_shape(int64_t T, int64_t tp, int64_t ep, int64_t num_experts, int64_t k, int64_t hidden,
                                  double capacity);

class ExpertExchange {
 public:
  // ep: the expert-parallel group; it must queue collectives on streams (can_enqueue()).
  ExpertExchange(Communicator* ep, int64_t num_experts, int64_t hidden);

  // Sends this tp rank's share of the real rows of x [T, H] (backend memory; the real rows are
  // those before the trailing padding rows, pos [T] < 0; cpu::expert_send_plan) to the owners of
  // their experts (ids [T, k], the share's rows valid) and lays out what this rank's experts run.
  // counts [E] (may be null) += the share's loads; *overflow = 1 when a block overflowed (backend
  // memory, int32). The rows travel, and the results come back in combine, as `wire` says
  // (arch/expert_wire.h).
  void dispatch(Scratch& scratch, const cpu::ExchangeShape& shape, const float* x, const int32_t* ids, int64_t T,
                cpu::RowShare share, const int32_t* pos, int64_t* counts, int32_t* overflow,
                ExpertWire wire = ExpertWire::kF32);
  // After dispatch: at most max_rows() rows, grouped per local expert by offsets() ([L + 1],
  // backend memory); input() [max_rows(), H], with its bf16 twin where the backend wants twins;
  // output() [max_rows(), H], filled by the caller (rows from offsets()[L] on are not read).
  int64_t max_rows() const { return shape_.ep * shape_.Cc; }
  const int32_t* offsets() const { return offsets_; }
  Activations input() const { return {input_, twin_}; }
  float* output() { return output_; }
  // Returns the results and writes out [T, H] (overwritten): each share token's weighted sum
  // (weights [T, k]), zeros for every other row.
  void combine(Scratch& scratch, const int32_t* ids, const float* weights, float* out);

  // Bytes one dispatch and one combine send to the other ranks (fixed by the shape).
  int64_t dispatch_bytes() const;
  int64_t combine_bytes() const;

 private:
  Communicator* ep_;
  int64_t E_, H_;
  cpu::ExchangeShape shape_;
  int64_t T_ = 0;
  ExpertWire wire_ = ExpertWire::kF32;
  int32_t* pair_row_ = nullptr;
  int32_t* offsets_ = nullptr;
  float* input_ = nullptr;
  uint16_t* twin_ = nullptr;  // input_'s bf16 twin, or null
  float* output_ = nullptr;
};

}  // namespace shardlm
