// Topology: where each rank sits in the parallel layout.
//
// world = replicas x pp x tp, tp innermost (ranks of a tensor-parallel group are neighbours, so
// they share a node), then pipeline stages, then replicas outermost. Attention data parallelism
// and expert parallelism add their axes with the MoE work.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

struct ModelSpec;

struct Layout {
  int tp = 1;        // tensor-parallel ranks per stage
  int pp = 1;        // pipeline stages per replica
  int replicas = 1;  // independent model copies
  int world() const { return tp * pp * replicas; }
  std::string str() const;  // "replicas=R pp=P tp=T"
};

struct Coords {
  int replica = 0, pp = 0, tp = 0;
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
  std::vector<int> tp_group() const;       // same replica and stage
  std::vector<int> pp_group() const;       // same replica and tp index: stage 0 .. pp-1
  std::vector<int> replica_group() const;  // every rank of this replica, world order
  std::vector<int> replica_leaders() const;  // (replica r, stage 0, tp 0) for each r
  int replica_leader() const;
  bool is_replica_leader() const { return coords_.pp == 0 && coords_.tp == 0; }

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
