#include "arch/moe_stage_sum.h"

#include <cstring>

#include "core/error.h"

namespace shardlm {

std::unique_ptr<CommRequest> receive_later_stages_moe(Communicator& pp, int last_stage, int64_t num_experts,
                                                      std::vector<int64_t>* wire) {
  wire->assign(static_cast<size_t>(num_experts) + 4, 0);
  return pp.irecv(wire->data(), wire->size(), CommDType::kI64, last_stage, kTagMoeSum);
}

void pass_moe_sum_on(Communicator& pp, int stage, int stages, const MoeStepStats& own, std::vector<int64_t>* wire) {
  const size_t E = own.expert_tokens.size();
  wire->assign(E + 4, 0);
  if (stage >= 2) pp.recv(wire->data(), wire->size(), CommDType::kI64, stage - 1, kTagMoeSum);
  MoeStepStats sum = own;
  add_moe_wire(*wire, &sum);
  std::vector<int64_t>& w = *wire;
  for (size_t e = 0; e < E; ++e) w[e] = sum.expert_tokens[e];
  w[E] = sum.dispatch_bytes;
  w[E + 1] = sum.combine_bytes;
  std::memcpy(&w[E + 2], &sum.dispatch_s, sizeof(double));  // the seconds' bits, exact
  std::memcpy(&w[E + 3], &sum.combine_s, sizeof(double));
  pp.send(w.data(), w.size(), CommDType::kI64, stage == stages - 1 ? 0 : stage + 1, kTagMoeSum);
}

void add_moe_wire(const std::vector<int64_t>& wire, MoeStepStats* s) {
  const size_t E = s->expert_tokens.size();
  SHARDLM_CHECK(wire.size() == E + 4, "MoE figures of " << wire.size() << " values for " << E << " experts");
  for (size_t e = 0; e < E; ++e) s->expert_tokens[e] += wire[e];
  s->dispatch_bytes += wire[E];
  s->combine_bytes += wire[E + 1];
  double d = 0, c = 0;
  std::memcpy(&d, &wire[E + 2], sizeof(double));
  std::memcpy(&c, &wire[E + 3], sizeof(double));
  s->dispatch_s += d;
  s->combine_s += c;
}

}  // namespace shardlm
