// Topology: where each rank sits in the parallel layout.
//
// world = replicas x pp x dp x tp, tp innermost (ranks of a tensor-parallel group are neighbours,
// so they share a node), then attention data-parallel groups, then pipeline stages, then replicas
// outermost. Each (replica, dp group) has its own leader, scheduler and prompts: an "engine
// group". The dp x tp ranks of one stage of a replica form its expert-parallel group when ep > 1:
// they hold disjoint experts and step through MoE layers together.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

struct ModelSpec;

struct Layout {
  int tp = 1;        // tensor-parallel ranks per attention group
  int pp = 1;        // pipeline stages per replica
  int replicas = 1;  // independent model copies
  int dp = 1;        // attention data-parallel groups per stage
  int ep = 1;        // expert-parallel ranks: 1 (experts split over tp) or dp x tp
  int world() const { return tp * dp * pp * replicas; }
  int engine_groups() const { return replicas * dp; }
  std::string str() const;  // "replicas=R pp=P dp=D tp=T ep=E" (dp and ep only when > 1)
};

struct Coords {
  int replica = 0, pp = 0, tp = 0, dp = 0;
};

class Topology {
 public:
  // Checks that the layout covers the world exactly and divides the model; throws Error saying
  // which number does not divide which.
  Topology(const Layout& layout, int world_rank, int world_size, const ModelSpec& spec);

  const Layout& layout() const { return layout_; }
  int world_rank() const { return rank_; }
  const Coords& coords() const { return coords_; }
  Coords coords_of(int world_rank) const;
  int rank_of(const Coords& c) const;

  // World ranks of this rank's groups, in group-rank order.
  std::vector<int> tp_group() const;       // same replica, stage and dp group
  std::vector<int> pp_group() const;       // same replica, dp group and tp index: stage 0 .. pp-1
  // This rank's engine group: same replica and dp group, every stage and tp index, leader first.
  std::vector<int> replica_group() const;
  std::vector<int> replica_leaders() const;  // every engine group's leader, world order
  int replica_leader() const;
  bool is_replica_leader() const { return coords_.pp == 0 && coords_.tp == 0; }
  // Engine group index (replica x dp + dp group), recorded with results and steps.
  int engine_group() const { return coords_.replica * layout_.dp + coords_.dp; }
  // The dp x tp ranks of this stage of this replica (ep rank = dp x tp + tp index).
  std::vector<int> ep_group() const;
  int ep_rank() const { return coords_.dp * layout_.tp + coords_.tp; }
  // The leaders of this replica's dp groups, which agree every step on whether to go on.
  std::vector<int> dp_leaders() const;

  // Layers [first, last) of stage s: contiguous, balanced (earlier stages take the remainder),
  // or as given by stage_layers.
  std::pair<int, int> stage_layers(int stage) const;
  void set_stage_layers(const std::vector<int>& counts, int num_layers);

 private:
  Layout layout_;
  int rank_ = 0;
  Coords coords_;
  int num_layers_ = 0;
  std::vector<int> stage_first_;  // pp + 1 boundaries
};

// Parses "--pp-layers 3,3,2" into per-stage counts; throws Error unless they are positive and sum
// to num_layers over pp stages.
std::vector<int> parse_stage_layers(const std::string& text, int pp, int num_layers);

}  // namespace shardlm
