#include "arch/expert_ffn.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "core/error.h"

namespace shardlm {

void LocalExperts::assign(std::vector<ExpertWeights> experts, ComputeBackend* stack_on) {
  experts_ = std::move(experts);
  for (const ExpertWeights& x : experts_)
    SHARDLM_CHECK(x.gate.rows == experts_[0].gate.rows && x.up.rows == x.gate.rows && x.gate.cols == x.up.cols,
                  "local experts: an expert's gate [" << x.gate.rows << ", " << x.gate.cols << "] and up [" << x.up.rows
                                                      << ", " << x.up.cols << "] differ from expert 0's "
                                                      << experts_[0].gate.rows << " rows");
  if (stack_on && !experts_.empty()) {
    std::vector<Matrix*> all;
    for (ExpertWeights& x : experts_) all.insert(all.end(), {&x.gate, &x.up});
    if (!stack_on->make_adjacent(all)) {
      for (ExpertWeights& x : experts_) stack_on->make_adjacent(std::vector<Matrix*>{&x.gate, &x.up});
    }
  }
  gate_.clear();
  up_.clear();
  down_.clear();
  gate_up_.clear();
  stacked_.clear();
  for (const ExpertWeights& x : experts_) {
    gate_.push_back(&x.gate);
    up_.push_back(&x.up);
    down_.push_back(&x.down);
    if (std::optional<Matrix> s = stacked_rows(x.gate, x.up)) stacked_.push_back(*s);
  }
  if (stacked_.size() != experts_.size()) return;  // all or none: one grouped call takes them
  for (const Matrix& s : stacked_) gate_up_.push_back(&s);
}

bool experts_read_twins(const ComputeBackend& b, const LocalExperts& experts) {
  return b.wants_bf16_twins() && experts.dtype() == DType::BF16;
}

void run_experts(Scratch& scratch, const LocalExperts& experts, int64_t H, Activations in,
                 const std::vector<int64_t>& offsets, float* out, int64_t max_chunk_rows) {
  const int64_t L = experts.size(), inter = experts.inter();
  SHARDLM_CHECK(static_cast<int64_t>(offsets.size()) == L + 1,
                "run_experts: " << offsets.size() << " offsets for " << L << " experts");
  if (offsets[L] == offsets[0]) return;
  ComputeBackend& b = scratch.backend();
  int64_t most = 0;
  for (int64_t e = 0; e < L; ++e) {
    SHARDLM_CHECK(offsets[e + 1] >= offsets[e], "run_experts: offsets decrease at expert " << e);
    most = std::max(most, offsets[e + 1] - offsets[e]);
  }
  const int64_t limit = std::max(max_chunk_rows < 0 ? b.grouped_linear_rows() : max_chunk_rows, most);
  // Chunks [first[c], first[c + 1]) of experts, each as many whole experts as fit in `limit` rows.
  std::vector<int64_t> first{0};
  int64_t chunk_rows = 0;
  for (int64_t e = 0; e < L; ++e) {
    if (offsets[e + 1] - offsets[first.back()] > limit) first.push_back(e);
    chunk_rows = std::max(chunk_rows, offsets[e + 1] - offsets[first.back()]);
  }
  first.push_back(L);
  // Stacked: gate and up side by side in each row of the first buffer, the activation in the
  // second; apart: gate, then up, the activation over gate.
  const int64_t width = experts.stacked() ? 2 * inter : inter;
  float* gate = scratch.get(Scratch::kFeedForward + 5, static_cast<size_t>(chunk_rows * width));
  float* up = scratch.get(Scratch::kFeedForward + 6, static_cast<size_t>(chunk_rows * inter));
  uint16_t* act_twin = nullptr;
  if (experts_read_twins(b, experts))
    act_twin = scratch.get_as<uint16_t>(Scratch::kFeedForward + 7, static_cast<size_t>(chunk_rows * inter));
  const ActivationsOut act{experts.stacked() ? up : gate, act_twin};
  std::vector<int64_t> off;
  std::vector<const Matrix*> w_in, w_up, w_down;  // the chunk's weights, refilled in place
  for (size_t c = 0; c + 1 < first.size(); ++c) {
    const int64_t e0 = first[c], e1 = first[c + 1], r0 = offsets[e0], n = offsets[e1] - r0;
    if (n == 0) continue;
    // The chunk's rows from 0: in, gate/up and out are offset to its first row.
    off.clear();
    for (int64_t e = e0; e <= e1; ++e) off.push_back(offsets[e] - r0);
    const auto& first_w = experts.stacked() ? experts.gate_up() : experts.gate();
    w_in.assign(first_w.begin() + e0, first_w.begin() + e1);
    w_down.assign(experts.down().begin() + e0, experts.down().begin() + e1);
    b.grouped_linear(in.from(r0 * H), off, w_in, gate);
    if (experts.stacked()) {
      b.silu_mul_stacked(gate, n, inter, act);
    } else {
      w_up.assign(experts.up().begin() + e0, experts.up().begin() + e1);
      b.grouped_linear(in.from(r0 * H), off, w_up, up);
      b.silu_mul(gate, up, act, n * inter);
    }
    b.grouped_linear(act, off, w_down, out + r0 * H);
  }
}

void run_routed_experts(Scratch& scratch, const LocalExperts& experts, Activations x, int64_t P, int64_t expect,
                        const int32_t* offsets, float* out) {
  if (P <= 0) return;
  ComputeBackend& b = scratch.backend();
  const int64_t I = experts.inter();
  float* gate = scratch.get(Scratch::kFeedForward + 5, static_cast<size_t>(P * (experts.stacked() ? 2 * I : I)));
  float* up = scratch.get(Scratch::kFeedForward + 6, static_cast<size_t>(P * I));
  // Rows past the routed ones go through the activation too and keep to themselves.
  const ActivationsOut act{
      experts.stacked() ? up : gate,
      b.wants_bf16_twins() ? scratch.get_as<uint16_t>(Scratch::kFeedForward + 7, static_cast<size_t>(P * I)) : nullptr};
  if (experts.stacked()) {
    b.grouped_linear_routed(x, P, expect, offsets, experts.gate_up(), gate);
    b.silu_mul_stacked(gate, P, I, act);
  } else {
    b.grouped_linear_routed(x, P, expect, offsets, experts.gate(), gate);
    b.grouped_linear_routed(x, P, expect, offsets, experts.up(), up);
    b.silu_mul(gate, up, act, P * I);
  }
  b.grouped_linear_routed(act, P, expect, offsets, experts.down(), out);
}

}  // namespace shardlm
