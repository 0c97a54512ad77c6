// Capacity planning for one layout of ranks: per-rank weight bytes, KV cache room, communication
// volume per token and roofline throughput estimates, plus a search over layouts.
//
// Rank layout (innermost first): tp x dp x pp x replicas = nodes x gpus_per_node.
//   tp: attention heads / MLP columns sharded; dp: attention data-parallel groups inside a replica
//   (each holds its own sequences; dense weights replicated over dp); routed experts sharded over
//   ep ranks of a stage (default ep = dp x tp); pp: layers split into stages; replicas: full
//   independent copies of the model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "arch/expert_wire.h"
#include "plan/gpu_specs.h"
#include "plan/model_footprint.h"

namespace shardlm::plan {

struct Layout {
  int nodes = 1, gpus_per_node = 8;
  int tp = 1, pp = 1, dp = 1;
  int ep = 0;  // 0: dp x tp for MoE models, 1 for dense ones
  int world() const { return nodes * gpus_per_node; }
  int replica_ranks() const { return tp * pp * dp; }
};

struct PlanOptions {
  WeightDtype dtype = WeightDtype::Fp8;
  WeightDtype kv_dtype = WeightDtype::Bf16;
  ExpertWire ep_wire = ExpertWire::kF32;          // rows in the ep all-to-alls (--ep-wire, arch/expert_wire.h)
  int64_t context = 8192;                         // tokens per request (prompt + output)
  // Fraction of the marketed HBM capacity the planner may use. 0.95 of 141e9 = 133.95e9 bytes on an
  // H200, itself only ~89% of the 143771 MiB (~150.8e9 bytes) the device reports, so the CUDA
  // context and allocator slack are covered by the difference.
  double hbm_fraction = 0.95;
  // Kept per GPU for activations, MoE/attention workspaces and NCCL buffers on top of the weights.
  // Decode batches are small (tens of MB of activations per layer); 2 GiB covers a prefill chunk
  // of ~8k tokens x hidden 7168 in bf16 several times over.
  double reserve_bytes = 2.0 * (1ull << 30);
};

struct LayoutPlan {
  Layout layout;
  int replicas = 1;
  int64_t stage_layers = 0;            // decoder layers on the heaviest stage
  std::vector<int64_t> stage_layer_counts;
  std::vector<double> stage_weight_bytes;  // per rank of each stage
  double weight_bytes = 0;             // per rank, heaviest stage
  double expert_weight_bytes = 0;      // of which routed experts (heaviest stage)
  double usable_bytes = 0, reserve_bytes = 0, free_bytes = 0;  // per rank, heaviest stage
  int64_t kv_bytes_per_token = 0;       // whole model, one copy (all layers)
  int64_t kv_bytes_per_token_rank = 0;  // stored by one rank per token of its dp group (heaviest stage)
  int64_t kv_capacity_tokens = 0;       // per rank = per dp group (min over stages)
  int64_t max_batch_per_dp = 0;         // requests of `context` tokens per dp group
  int64_t max_batch = 0;                // per replica = dp x max_batch_per_dp
  bool fits = false;
  std::string why_not;                  // when !fits

  // Communication per token (bytes), see layout_plan.cpp for the formulas.
  int64_t tp_allreduces_per_token = 0;        // per replica pass through all layers
  double tp_allreduce_bytes_per_token = 0;    // message bytes, all layers
  double tp_wire_bytes_per_token_rank = 0;    // ring: 2 (tp-1)/tp x message
  double ep_dispatch_bytes_per_token = 0;     // all-to-all, all MoE layers
  double ep_combine_bytes_per_token = 0;
  double pp_bytes_per_token = 0;              // activations over the pp-1 stage boundaries
  std::string tp_link, ep_link, pp_link;      // "nvlink" | "efa" | "-"

  // Roofline estimates (ceilings).
  double decode_mem_s = 0, decode_compute_s = 0, decode_comm_s = 0, decode_step_s = 0;
  double decode_bytes_rank = 0, decode_flops_rank = 0;
  double expert_active_fraction = 1;
  double decode_tok_s_replica = 0, decode_tok_s = 0;    // per replica, all replicas
  double prefill_tok_s_replica = 0, prefill_tok_s = 0;
  std::string decode_bound;  // "memory" | "compute"
};

// Validates the layout (Error naming the numbers that do not divide) and plans it.
LayoutPlan plan_layout(const ModelFootprint& m, const GpuSpec& gpu, Layout layout, const PlanOptions& opt);

// Fills what the user left unset (tp <= 0, pp <= 0, dp <= 0): tp = the largest of 8,4,2,1 that
// divides gpus_per_node and the heads; then, when neither pp nor dp is given, the smallest dp
// (MoE: experts spread over more ranks) or pp (dense) that fits, else the largest valid one.
Layout default_layout(const ModelFootprint& m, const GpuSpec& gpu, Layout partial, const PlanOptions& opt);

// Layouts over the same nodes (tp in 1,2,4,8; pp dividing the world; dp for MoE models) that fit,
// best estimated total decode tokens/s first.
std::vector<LayoutPlan> suggest_layouts(const ModelFootprint& m, const GpuSpec& gpu, int nodes, int gpus_per_node,
                                        const PlanOptions& opt, size_t top = 5);

nlohmann::json to_json(const LayoutPlan& p);
nlohmann::json footprint_json(const ModelFootprint& m, WeightDtype d);
std::string layout_name(const Layout& l);  // "tp 8 x pp 1 x dp 1 (ep 8)"

}  // namespace shardlm::plan
