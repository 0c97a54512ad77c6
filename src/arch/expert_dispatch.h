// Expert-parallel dispatch and combine of one MoE layer (host memory, over the ep communicator).
//
// The routed experts are spread over the ep group in contiguous ranges: with E experts and ep
// ranks, rank r owns experts [r * E/ep, (r + 1) * E/ep). One step goes:
//
//   dispatch  every rank sends each of its tokens once to every rank owning at least one of the
//             token's experts: a record of the hidden row (H floats) and the local indices of the
//             experts it is for (min(k, E/ep) int32 slots, -1 padded). A token routed to two
//             experts of the same rank travels once and is used twice. The record counts go
//             first (all_to_all), then the records (all_to_allv). The owner gathers the rows per
//             local expert: rows [offsets[e], offsets[e+1]) of input() are expert e's, contiguous,
//             so each expert runs as plain GEMMs on contiguous rows.
//   experts   the caller fills output() ([R, H], same order as input()).
//   combine   the results go back by the reverse all_to_allv, one row per (token, expert) pair (not
//             pre-summed at the owner), and the token's rank sums them with the routing weights in
//             ascending global expert index:  out[t] = sum over e of w(t,e) * y_e(x_t).
//
// Because each (token, expert) result comes back unsummed and the sum runs in a fixed order, and
// the matmul is batch invariant (a row's bits do not depend on the other rows of the GEMM), the
// combined output is bit-identical whatever the expert-parallel layout, and identical to the
// single-rank path (ep null or of size 1: nothing travels, the same gather and the same sum).
// The price is combine bytes: one row per pair instead of one per (token, rank).
//
// Every rank of the group must call dispatch and combine for every step, with T = 0 when it has
// no tokens, so that the all-to-alls pair up.
#pragma once

#include <cstdint>
#include <vector>

#include "arch/moe_router.h"
#include "arch/scratch.h"
#include "compute/backend.h"

namespace shardlm {

class Communicator;

// One routed expert's SwiGLU weights (this rank's slice of its intermediate dimension).
struct ExpertWeights {
  Matrix gate, up, down;  // [inter, H], [inter, H], [H, inter]
};

// The experts' GEMMs: for local expert e, rows [offsets[e], offsets[e+1]) of in [R, H] (host) go
// through down(silu(gate(x)) * up(x)) into the same rows of out [R, H] (host), as plain linears
// on contiguous rows (an expert with no row is skipped). Uses scratch slots
// Scratch::kFeedForward + 4 .. + 7.
void run_experts(Scratch& scratch, const std::vector<ExpertWeights>& experts, int64_t inter, int64_t H,
                 const float* in, const std::vector<int64_t>& offsets, float* out);

// out[j] += w * y[j] for j < n: the one accumulation used by every combine path (so that every
// path rounds identically).
void moe_accumulate(float* out, float w, const float* y, int64_t n);

class ExpertDispatch {
 public:
  // ep: the expert-parallel group (null: one rank holding every expert).
  ExpertDispatch(Communicator* ep, int64_t num_experts, int64_t hidden);

  // Sends this rank's T rows x [T, H] (host) to the owners of their routed experts and gathers
  // what this rank's experts must run. `r` holds T tokens.
  void dispatch(const float* x, const Routing& r);
  // After dispatch: rows this rank's experts run, grouped per local expert.
  int64_t rows() const { return offsets_.back(); }
  const std::vector<int64_t>& offsets() const { return offsets_; }  // [local experts + 1]
  const float* input() const { return input_.data(); }              // [rows(), H]
  float* output();                                                  // [rows(), H], filled by the caller
  // Returns the results to the tokens' ranks and writes out [T, H] (host; overwritten).
  void combine(float* out);

  int64_t local_experts() const { return per_rank_; }
  int64_t first_local_expert() const { return static_cast<int64_t>(rank_) * per_rank_; }

  // Figures of the last dispatch and combine: wall seconds (packing, exchange and gathering
  // included) and payload bytes this rank sent to other ranks (its own share and the count
  // exchange not included).
  double dispatch_seconds = 0, combine_seconds = 0;
  int64_t dispatch_bytes = 0, combine_bytes = 0;

 private:
  Communicator* ep_;
  int rank_ = 0, size_ = 1;
  int64_t E_, H_, per_rank_;
  int64_t slots_ = 0;  // expert slots per record: min(k, per_rank)
  int64_t T_ = 0;

  // This rank's (token, expert) pairs in ascending (expert, token) order: the order results come
  // back in; weights alongside.
  std::vector<int32_t> pair_token_;
  std::vector<float> pair_weight_;
  std::vector<int64_t> pairs_to_;  // [size] pairs this rank sends to each owner

  // Owner side.
  std::vector<int64_t> offsets_;            // [per_rank + 1] rows per local expert
  std::vector<float> input_, output_;       // [rows, H]
  std::vector<int64_t> from_cnt_;           // [size * per_rank] pairs received from s for local expert e
  std::vector<int64_t> pairs_from_;         // [size] pairs received from each rank

  // Exchange buffers.
  std::vector<uint8_t> send_rec_, recv_rec_;
  std::vector<float> send_res_, recv_res_;
};

}  // namespace shardlm
