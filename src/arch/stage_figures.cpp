#include "arch/stage_figures.h"

#include <cstring>

#include "core/error.h"

namespace shardlm {

namespace {

constexpr size_t kMoeSlots = 4;  // dispatch and combine bytes, then their seconds' bits

size_t wire_size(int64_t num_experts, int stages) {
  return static_cast<size_t>(num_experts) + kMoeSlots + 2 * static_cast<size_t>(stages);
}

// Doubles travel as their bits: exact, and in the one int64 message.
int64_t bits(double x) {
  int64_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
double from_bits(int64_t b) {
  double x = 0;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Adds the MoE sums of the wire to s.
void add_moe(const std::vector<int64_t>& w, size_t E, MoeStepStats* s) {
  for (size_t e = 0; e < E; ++e) s->expert_tokens[e] += w[e];
  s->dispatch_bytes += w[E];
  s->combine_bytes += w[E + 1];
  s->dispatch_s += from_bits(w[E + 2]);
  s->combine_s += from_bits(w[E + 3]);
}

}  // namespace

std::unique_ptr<CommRequest> receive_later_stages(Communicator& pp, int stages, int64_t num_experts,
                                                  std::vector<int64_t>* wire) {
  wire->assign(wire_size(num_experts, stages), 0);
  return pp.irecv(wire->data(), wire->size(), CommDType::kI64, stages - 1, kTagStageFigures);
}

void pass_figures_on(Communicator& pp, int stage, int stages, const MoeStepStats* own_moe, StageSeconds own,
                     std::vector<int64_t>* wire) {
  const size_t E = own_moe ? own_moe->expert_tokens.size() : 0;
  wire->assign(wire_size(static_cast<int64_t>(E), stages), 0);
  std::vector<int64_t>& w = *wire;
  if (stage >= 2) pp.recv(w.data(), w.size(), CommDType::kI64, stage - 1, kTagStageFigures);
  if (own_moe) {
    MoeStepStats sum = *own_moe;
    add_moe(w, E, &sum);
    for (size_t e = 0; e < E; ++e) w[e] = sum.expert_tokens[e];
    w[E] = sum.dispatch_bytes;
    w[E + 1] = sum.combine_bytes;
    w[E + 2] = bits(sum.dispatch_s);
    w[E + 3] = bits(sum.combine_s);
  }
  const size_t at = E + kMoeSlots + 2 * static_cast<size_t>(stage);
  w[at] = bits(own.compute_s);
  w[at + 1] = bits(own.comm_s);
  pp.send(w.data(), w.size(), CommDType::kI64, stage == stages - 1 ? 0 : stage + 1, kTagStageFigures);
}

void read_later_stages(const std::vector<int64_t>& wire, int stages, MoeStepStats* moe,
                       std::vector<StageSeconds>* seconds) {
  const size_t E = moe ? moe->expert_tokens.size() : 0;
  SHARDLM_CHECK(wire.size() == wire_size(static_cast<int64_t>(E), stages),
                "stage figures of " << wire.size() << " values for " << E << " experts and " << stages << " stages");
  if (moe) add_moe(wire, E, moe);
  seconds->resize(static_cast<size_t>(stages));
  for (int s = 1; s < stages; ++s) {
    const size_t at = E + kMoeSlots + 2 * static_cast<size_t>(s);
    (*seconds)[static_cast<size_t>(s)] = StageSeconds{from_bits(wire[at]), from_bits(wire[at + 1])};
  }
}

}  // namespace shardlm
