// A rank's routed experts and their SwiGLU, down(silu(gate(x)) * up(x)), run over the rows routed
// to them: every expert's projection in one grouped call, as a Mixture-of-Experts layer needs.
//
// Where the backend placed each expert's gate and up one after another at load
// (ComputeBackend::make_adjacent), they run as one weight [2 inter, H] per expert, vLLM's merged
// w13: one grouped call for both projections, reading the rows once, then silu_mul_stacked on its
// [rows, 2 inter] output. Each row's gate and up columns have the bits the separate calls give
// them wherever the backend's GEMM computes an output element alone, independent of the columns
// beside it (the CPU's; the CUDA backend's routed kernels and its own grouped fp8 kernels), so
// stacking changes no bit there; cuBLAS and cuBLASLt may choose another algorithm for the wider
// product.
#pragma once

#include <cstdint>
#include <vector>

#include "arch/scratch.h"
#include "compute/backend.h"

namespace shardlm {

// One routed expert's SwiGLU weights (this rank's slice of its intermediate dimension).
struct ExpertWeights {
  Matrix gate, up, down;  // [inter, H], [inter, H], [H, inter]
};

// This rank's experts, as the grouped calls take them: per projection, one weight per expert.
// Holds pointers into itself: not copied.
class LocalExperts {
 public:
  LocalExperts() = default;
  LocalExperts(const LocalExperts&) = delete;
  LocalExperts& operator=(const LocalExperts&) = delete;

  // Takes the experts (one shape for all). With `stack_on` (the backend that loaded them), asks it
  // to place every expert's gate and up one after another: all in one move, or where the device has
  // no room for that second copy, expert by expert. gate_up() holds the stacked weights when every
  // expert's gate and up lie so (stacked_rows), however they came to.
  void assign(std::vector<ExpertWeights> experts, ComputeBackend* stack_on = nullptr);

  int64_t size() const { return static_cast<int64_t>(experts_.size()); }
  int64_t inter() const { return experts_.empty() ? 0 : experts_[0].gate.rows; }
  DType dtype() const { return experts_.empty() ? DType::F32 : experts_[0].gate.dtype; }
  const std::vector<ExpertWeights>& weights() const { return experts_; }
  const std::vector<const Matrix*>& gate() const { return gate_; }
  const std::vector<const Matrix*>& up() const { return up_; }
  const std::vector<const Matrix*>& down() const { return down_; }
  // Each expert's gate and up as one weight [2 inter, H]; empty unless every expert's are adjacent.
  const std::vector<const Matrix*>& gate_up() const { return gate_up_; }
  bool stacked() const { return !gate_up_.empty(); }

 private:
  std::vector<ExpertWeights> experts_;
  std::vector<Matrix> stacked_;  // gate_up_ points here
  std::vector<const Matrix*> gate_, up_, down_, gate_up_;
};

// Whether run_experts' grouped calls read their rows as a bf16 twin where the rows have one: the
// backend's GEMMs read bf16 activations and the experts are bf16. (fp8 experts' groups past 16 rows
// quantise the fp32 rows for their W8A8 GEMMs, so a twin of a prefill's rows would mostly be
// written for nothing; the routed calls' direct kernel reads it, see run_routed_experts.)
bool experts_read_twins(const ComputeBackend& b, const LocalExperts& experts);

// The experts' GEMMs: for local expert e, rows [offsets[e], offsets[e+1]) of in [R, H] (backend
// memory; its twin read where it has one) go through down(silu(gate(x)) * up(x)) into the same rows
// of out [R, H] (backend memory) (an expert with no row is skipped). Each projection runs as one
// grouped_linear over a chunk of consecutive experts (gate and up as one, where stacked), so a
// backend with grouped GEMMs launches two or three GEMMs per chunk, not three per expert. A chunk
// holds at most max(max_chunk_rows, the largest expert's rows) rows, which bounds the gate/up
// scratch; max_chunk_rows < 0 takes the backend's grouped_linear_rows() (CUDA: 16384 rows, usually
// one chunk; CPU: 0, so experts go one by one, small ones merged, and the gate/up rows stay in
// cache between the GEMMs). A row's result does not depend on the chunking (each row's linear is
// batch invariant; silu_mul is elementwise). Uses scratch slots Scratch::kFeedForward + 5 and + 6
// (chunk rows x inter floats each, the first twice that where stacked) and, where
// experts_read_twins, + 7 (the activation's twin, which the down projection reads).
void run_experts(Scratch& scratch, const LocalExperts& experts, int64_t H, Activations in,
                 const std::vector<int64_t>& offsets, float* out, int64_t max_chunk_rows = -1);

// The same from the experts' row ranges in backend memory (grouped_linear_routed: nothing read on
// the host, so a captured step holds it): offsets [L + 1] (int32, backend memory), offsets[L] <= P;
// x [P, H], out [P, H] (rows from offsets[L] on are not read; those of out are not written).
// expect: the rows the groups usually hold (grouped_linear_routed). Slots Scratch::kFeedForward + 5
// and + 6 (P x inter floats each, the first twice that where stacked) and + 7 (the activation's
// twin, where the backend wants one).
void run_routed_experts(Scratch& scratch, const LocalExperts& experts, Activations x, int64_t P, int64_t expect,
                        const int32_t* offsets, float* out);

}  // namespace shardlm
