#include "parallel/topology.h"

#include <sstream>

#include "core/error.h"
#include "model/model_spec.h"

namespace shardlm {

std::string Layout::str() const {
  std::string s = "replicas=" + std::to_string(replicas) + " pp=" + std::to_string(pp);
  if (dp > 1) s += " dp=" + std::to_string(dp);
  s += " tp=" + std::to_string(tp);
  if (ep > 1) s += " ep=" + std::to_string(ep);
  return s;
}

Topology::Topology(const Layout& layout, int world_rank, int world_size, const ModelSpec& spec)
    : layout_(layout), rank_(world_rank), num_layers_(static_cast<int>(spec.num_layers)) {
  SHARDLM_CHECK(layout.tp >= 1 && layout.pp >= 1 && layout.replicas >= 1 && layout.dp >= 1 && layout.ep >= 1,
                "layout " << layout.str() << ": every axis must be >= 1");
  SHARDLM_CHECK(layout.world() == world_size, "layout " << layout.str() << " needs " << layout.world()
                                                        << " ranks but the job has " << world_size
                                                        << " (mpirun -np must equal replicas x pp x dp x tp)");
  if (layout.ep > 1) {
    SHARDLM_CHECK(spec.moe.enabled(), "--ep " << layout.ep << ": " << spec.architecture
                                              << " has no experts to spread (expert parallelism needs an MoE model)");
    SHARDLM_CHECK(layout.ep == layout.dp * layout.tp,
                  "--ep " << layout.ep << " must be 1 or dp x tp = " << layout.dp * layout.tp
                          << " (the experts of a stage are spread over all of its ranks)");
    SHARDLM_CHECK(spec.moe.num_experts % layout.ep == 0, "--ep " << layout.ep << " does not divide the "
                                                                  << spec.moe.num_experts << " routed experts");
  } else if (spec.moe.enabled()) {
    SHARDLM_CHECK(spec.moe.expert_intermediate % layout.tp == 0,
                  "--tp " << layout.tp << " does not divide the expert intermediate size "
                          << spec.moe.expert_intermediate << " (with --ep 1 every expert is split over tp)");
  }
  const int tp = layout.tp;
  SHARDLM_CHECK(spec.num_heads % tp == 0, "--tp " << tp << " does not divide the " << spec.num_heads
                                                  << " attention heads (num_attention_heads)");
  SHARDLM_CHECK(spec.num_kv_heads % tp == 0 || tp % spec.num_kv_heads == 0,
                "--tp " << tp << " and the " << spec.num_kv_heads
                        << " KV heads (num_key_value_heads): one must divide the other (KV heads are split, or "
                           "replicated when tp exceeds them)");
  SHARDLM_CHECK(spec.intermediate_size % tp == 0, "--tp " << tp << " does not divide intermediate_size "
                                                          << spec.intermediate_size);
  SHARDLM_CHECK(spec.vocab_size % tp == 0, "--tp " << tp << " does not divide vocab_size " << spec.vocab_size
                                                   << " (the embedding and LM head are split by vocabulary)");
  SHARDLM_CHECK(layout.pp <= spec.num_layers, "--pp " << layout.pp << " exceeds the model's " << spec.num_layers
                                                      << " layers (each stage needs at least one)");
  coords_ = coords_of(world_rank);
  std::vector<int> counts(layout.pp);
  for (int s = 0; s < layout.pp; ++s) counts[s] = num_layers_ / layout.pp + (s < num_layers_ % layout.pp ? 1 : 0);
  set_stage_layers(counts, num_layers_);
}

Coords Topology::coords_of(int r) const {
  Coords c;
  c.tp = r % layout_.tp;
  c.dp = (r / layout_.tp) % layout_.dp;
  c.pp = (r / (layout_.tp * layout_.dp)) % layout_.pp;
  c.replica = r / (layout_.tp * layout_.dp * layout_.pp);
  return c;
}

int Topology::rank_of(const Coords& c) const {
  return ((c.replica * layout_.pp + c.pp) * layout_.dp + c.dp) * layout_.tp + c.tp;
}

std::vector<int> Topology::tp_group() const {
  std::vector<int> g;
  for (int t = 0; t < layout_.tp; ++t) g.push_back(rank_of({coords_.replica, coords_.pp, t, coords_.dp}));
  return g;
}

std::vector<int> Topology::pp_group() const {
  std::vector<int> g;
  for (int s = 0; s < layout_.pp; ++s) g.push_back(rank_of({coords_.replica, s, coords_.tp, coords_.dp}));
  return g;
}

std::vector<int> Topology::replica_group() const {
  std::vector<int> g;
  for (int s = 0; s < layout_.pp; ++s) {
    for (int t = 0; t < layout_.tp; ++t) g.push_back(rank_of({coords_.replica, s, t, coords_.dp}));
  }
  return g;
}

std::vector<int> Topology::replica_leaders() const {
  std::vector<int> g;
  for (int r = 0; r < layout_.replicas; ++r) {
    for (int d = 0; d < layout_.dp; ++d) g.push_back(rank_of({r, 0, 0, d}));
  }
  return g;
}

int Topology::replica_leader() const { return rank_of({coords_.replica, 0, 0, coords_.dp}); }

std::vector<int> Topology::ep_group() const {
  std::vector<int> g;
  for (int d = 0; d < layout_.dp; ++d) {
    for (int t = 0; t < layout_.tp; ++t) g.push_back(rank_of({coords_.replica, coords_.pp, t, d}));
  }
  return g;
}

std::vector<int> Topology::dp_leaders() const {
  std::vector<int> g;
  for (int d = 0; d < layout_.dp; ++d) g.push_back(rank_of({coords_.replica, 0, 0, d}));
  return g;
}

std::pair<int, int> Topology::stage_layers(int stage) const { return {stage_first_[stage], stage_first_[stage + 1]}; }

void Topology::set_stage_layers(const std::vector<int>& counts, int num_layers) {
  SHARDLM_CHECK(static_cast<int>(counts.size()) == layout_.pp, "stage layer counts: " << counts.size() << " given for "
                                                                                       << layout_.pp << " stages");
  stage_first_.assign(1, 0);
  for (int c : counts) {
    SHARDLM_CHECK(c >= 1, "every pipeline stage needs at least one layer");
    stage_first_.push_back(stage_first_.back() + c);
  }
  SHARDLM_CHECK(stage_first_.back() == num_layers, "stage layer counts sum to " << stage_first_.back()
                                                                               << " but the model has " << num_layers
                                                                               << " layers");
}

std::vector<int> parse_stage_layers(const std::string& text, int pp, int num_layers) {
  std::vector<int> counts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SHARDLM_CHECK(used == item.size() && !item.empty() && v >= 1, "--pp-layers '" << text << "': '" << item
                                                                                   << "' is not a positive layer count");
    counts.push_back(v);
  }
  SHARDLM_CHECK(static_cast<int>(counts.size()) == pp, "--pp-layers '" << text << "' gives " << counts.size()
                                                                        << " stages but --pp is " << pp);
  int sum = 0;
  for (int c : counts) sum += c;
  SHARDLM_CHECK(sum == num_layers, "--pp-layers '" << text << "' sums to " << sum << " but the model has "
                                                   << num_layers << " layers");
  return counts;
}

}  // namespace shardlm
