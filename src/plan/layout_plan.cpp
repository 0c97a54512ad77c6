#include "plan/layout_plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace shardlm::plan {

namespace {

int divisor_of(Split s, const Layout& l, const ModelFootprint& m) {
  switch (s) {
    case Split::Tp: return l.tp;
    case Split::TpKv: return static_cast<int>(std::min<int64_t>(l.tp, m.kv_heads));
    case Split::Replicated: return 1;
    // Expert-parallel: each rank holds its share of the experts whole; with ep 1 every expert is
    // split over tp instead (parallel/topology.cpp).
    case Split::Ep:
      return l.ep > 1 ? l.ep : l.tp;
  }
  return 1;
}

double bytes_per_value(WeightDtype d) { return d == WeightDtype::Fp8 ? 1.0 : 2.0; }

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

void validate(const ModelFootprint& m, Layout& l) {
  SHARDLM_CHECK(l.nodes >= 1 && l.gpus_per_node >= 1,
                "nodes " << l.nodes << " and gpus-per-node " << l.gpus_per_node << " must be >= 1");
  SHARDLM_CHECK(l.tp >= 1 && l.pp >= 1 && l.dp >= 1 && l.ep >= 0,
                "tp " << l.tp << ", pp " << l.pp << ", dp " << l.dp << " must be >= 1");
  SHARDLM_CHECK(l.world() % l.replica_ranks() == 0,
                "layout tp " << l.tp << " x pp " << l.pp << " x dp " << l.dp << " = " << l.replica_ranks()
                             << " ranks does not divide the world of " << l.world() << " ranks (" << l.nodes
                             << " nodes x " << l.gpus_per_node << " GPUs)");
  SHARDLM_CHECK(m.heads % l.tp == 0, "tp " << l.tp << " does not divide num_attention_heads " << m.heads);
  SHARDLM_CHECK(m.vocab % l.tp == 0, "tp " << l.tp << " does not divide vocab_size " << m.vocab
                                           << " (the embedding and LM head are split by vocabulary)");
  if (!m.mla)
    SHARDLM_CHECK(m.kv_heads % l.tp == 0 || l.tp % m.kv_heads == 0,
                  "tp " << l.tp << " and num_key_value_heads " << m.kv_heads << ": neither divides the other");
  if (m.moe_layers < m.layers)
    SHARDLM_CHECK(m.intermediate % l.tp == 0, "tp " << l.tp << " does not divide intermediate_size " << m.intermediate);
  if (m.shared_intermediate > 0)
    SHARDLM_CHECK(m.shared_intermediate % l.tp == 0,
                  "tp " << l.tp << " does not divide the shared experts' intermediate size " << m.shared_intermediate);
  SHARDLM_CHECK(l.pp <= m.layers, "pp " << l.pp << " exceeds num_hidden_layers " << m.layers);
  if (m.moe()) {
    // As shardlm run takes it (parallel/topology.cpp): the experts over every rank of a stage
    // (ep = dp x tp), or each expert split over tp (ep 1).
    if (l.ep == 0) l.ep = l.dp * l.tp;
    SHARDLM_CHECK(l.ep == 1 || l.ep == l.dp * l.tp,
                  "ep " << l.ep << " must be 1 or dp x tp = " << l.dp << " x " << l.tp << " = " << l.dp * l.tp);
    SHARDLM_CHECK(m.n_routed_experts % l.ep == 0,
                  "ep " << l.ep << " does not divide n_routed_experts " << m.n_routed_experts);
    if (l.ep == 1)
      SHARDLM_CHECK(m.moe_intermediate % l.tp == 0, "tp " << l.tp << " does not divide the experts' intermediate size "
                                                          << m.moe_intermediate
                                                          << " (with ep 1 every expert is split over tp)");
  } else {
    if (l.ep == 0) l.ep = 1;
    SHARDLM_CHECK(l.ep == 1, "ep " << l.ep << " given but " << m.name << " has no routed experts");
  }
}

bool gqa_tp_ok(const ModelFootprint& m, int t) {
  return m.mla || m.kv_heads % t == 0 || t % m.kv_heads == 0;
}

}  // namespace

std::string layout_name(const Layout& l) {
  std::ostringstream os;
  os << "tp " << l.tp << " x pp " << l.pp << " x dp " << l.dp;
  if (l.ep > 1) os << " (ep " << l.ep << ")";
  return os.str();
}

LayoutPlan plan_layout(const ModelFootprint& m, const GpuSpec& gpu, Layout l, const PlanOptions& opt) {
  validate(m, l);
  SHARDLM_CHECK(opt.context >= 1, "context " << opt.context << " must be >= 1");
  SHARDLM_CHECK(opt.hbm_fraction > 0 && opt.hbm_fraction <= 1, "hbm fraction " << opt.hbm_fraction << " must be in (0, 1]");
  LayoutPlan p;
  p.layout = l;
  p.replicas = l.world() / l.replica_ranks();
  const int gpn = l.gpus_per_node;
  const int64_t L = m.layers;

  // ---- layers per stage: L / pp each, the remainder one more on the first stages (as
  // parallel/topology.cpp splits them) ----
  std::vector<int> stage_of(L + 2);
  p.stage_layer_counts.assign(l.pp, L / l.pp);
  for (int64_t s = 0; s < L % l.pp; ++s) p.stage_layer_counts[s]++;
  for (int64_t s = 0, i = 0; s < l.pp; ++s)
    for (int64_t k = 0; k < p.stage_layer_counts[s]; ++k) stage_of[i++] = static_cast<int>(s);

  // ---- weights per rank of each stage ----
  p.stage_weight_bytes.assign(l.pp, 0);
  std::vector<double> stage_expert(l.pp, 0);
  for (const auto& piece : m.pieces) {
    const int s = piece.layer < 0 ? 0 : piece.layer >= L ? l.pp - 1 : stage_of[piece.layer];
    const double b = piece.bytes(opt.dtype) / divisor_of(piece.split, l, m);
    p.stage_weight_bytes[s] += b;
    if (piece.component == Component::RoutedExperts) stage_expert[s] += b;
    // Tied embeddings: the last stage loads its LM head as its own copy of the embedding
    // (arch/decoder.cpp), even where that stage holds the embedding as well.
    if (m.tied_embeddings && piece.component == Component::Embedding && piece.layer < 0)
      p.stage_weight_bytes[l.pp - 1] += b;
  }

  // ---- KV cache ----
  // Bytes per token per layer. MLA caches the compressed latent (kv_lora_rank) and the shared rope
  // key (qk_rope_head_dim) once per token, not per head: every tp rank of an attention group holds
  // the whole latent (replicated over tp). GQA caches k and v per kv head, split by tp (a head is
  // replicated when tp > kv heads). Either way each dp group caches its own sequences only, and each
  // pp stage its own layers.
  const double kvb = bytes_per_value(opt.kv_dtype);
  p.kv_bytes_per_token = static_cast<int64_t>(double(m.kv_values_per_token_per_layer()) * kvb) * L;
  const int64_t kv_layer_rank =
      m.mla ? static_cast<int64_t>(double(m.kv_lora_rank + m.qk_rope_head_dim) * kvb)
            : static_cast<int64_t>(2.0 * double(m.kv_heads / std::min<int64_t>(l.tp, m.kv_heads)) *
                                   double(m.head_dim) * kvb);
  p.usable_bytes = gpu.hbm_bytes * opt.hbm_fraction;
  p.reserve_bytes = opt.reserve_bytes;
  p.kv_capacity_tokens = INT64_MAX;
  p.free_bytes = INT64_MAX;
  int heaviest = 0;
  for (int s = 0; s < l.pp; ++s) {
    const double free = p.usable_bytes - p.stage_weight_bytes[s] - p.reserve_bytes;
    const int64_t per_token = kv_layer_rank * p.stage_layer_counts[s];
    const int64_t tokens = free > 0 ? static_cast<int64_t>(free / double(per_token)) : 0;
    p.kv_capacity_tokens = std::min(p.kv_capacity_tokens, tokens);
    p.free_bytes = std::min(p.free_bytes, free);
    p.kv_bytes_per_token_rank = std::max(p.kv_bytes_per_token_rank, per_token);
    if (p.stage_weight_bytes[s] > p.stage_weight_bytes[heaviest]) heaviest = s;
  }
  p.weight_bytes = p.stage_weight_bytes[heaviest];
  p.expert_weight_bytes = stage_expert[heaviest];
  p.stage_layers = *std::max_element(p.stage_layer_counts.begin(), p.stage_layer_counts.end());
  p.max_batch_per_dp = p.kv_capacity_tokens / opt.context;
  p.max_batch = p.max_batch_per_dp * l.dp;
  p.fits = p.max_batch_per_dp >= 1;
  if (!p.fits) {
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(2);
    if (p.free_bytes <= 0)
      os << "weights " << p.weight_bytes / 1e9 << " GB + reserve " << p.reserve_bytes / 1e9 << " GB exceed usable "
         << p.usable_bytes / 1e9 << " GB per rank";
    else
      os << "KV room for " << p.kv_capacity_tokens << " tokens per rank < one request of " << opt.context << " tokens";
    p.why_not = os.str();
  }

  // ---- communication per token ----
  // shardlm's residual stream is fp32, and so are its tp all-reduces and stage hand-offs.
  // tp all-reduce of the hidden state: after attention and after the MLP of every layer, so
  //   2 x hidden x 4 bytes x layers per token (message size); a ring moves 2 (tp-1)/tp of it per rank.
  //   When ep <= tp the experts live inside the tp group and their partial sums ride the second
  //   all-reduce. When ep > tp (dp attention + expert parallelism) a MoE layer instead has one
  //   all-reduce after attention (plus one for the tp-split shared expert) and the exchange's two
  //   all-to-alls (below), their rows as --ep-wire says.
  // pp: hidden x 4 bytes per token over each of the pp-1 stage boundaries.
  constexpr double kActivationBytes = 4.0;
  const int64_t H = m.hidden;
  const bool a2a = m.moe() && l.ep > l.tp;
  int64_t allreduces = 0;
  for (int64_t i = 0; i < L; ++i) {
    if (a2a && m.layer_is_moe[i])
      allreduces += 1 + (m.shared_intermediate > 0 ? 1 : 0);
    else
      allreduces += 2;
  }
  if (l.tp == 1) allreduces = 0;
  p.tp_allreduces_per_token = allreduces;
  p.tp_allreduce_bytes_per_token = double(allreduces) * double(H) * kActivationBytes;
  p.tp_wire_bytes_per_token_rank = p.tp_allreduce_bytes_per_token * 2.0 * (l.tp - 1) / l.tp;
  if (a2a) {
    // shardlm's exchange (arch/expert_dispatch.h): a token goes once to each rank owning one of its
    // experts, at most min(k, ep) records of H values and min(k, experts per rank) int32 slots;
    // each (token, expert) result comes back as a row of H values.
    const int64_t k = m.experts_per_token, records = std::min<int64_t>(k, l.ep);
    const int64_t slots = std::min<int64_t>(k, std::max<int64_t>(m.n_routed_experts / l.ep, 1));
    const auto row = double(wire_block_bytes(opt.ep_wire, H, H, H));
    const auto result = double(wire_block_bytes(combine_wire(opt.ep_wire), H, H, H));
    p.ep_dispatch_bytes_per_token = double(m.moe_layers) * double(records) * (row + double(slots) * 4.0);
    p.ep_combine_bytes_per_token = double(m.moe_layers) * double(k) * result;
  }
  p.pp_bytes_per_token = double(l.pp - 1) * double(H) * kActivationBytes;
  const double efa_gpu = gpu.node_net_bw / gpn;
  const bool tp_in_node = l.tp <= gpn && gpn % l.tp == 0;
  p.tp_link = l.tp == 1 ? "-" : tp_in_node ? "nvlink" : "efa";
  p.ep_link = !a2a ? "-" : l.ep <= gpn ? "nvlink" : "nvlink+efa";
  p.pp_link = l.pp == 1 ? "-" : l.replica_ranks() > gpn ? "efa" : "nvlink";

  // ---- roofline estimates ----
  // Decode, one step = one token for each of the B = max_batch sequences of a replica, each at the
  // full --context (worst case), on the heaviest rank:
  //   bytes = mb x (dense weights + f x routed-expert weights) + B_dp x context x KV bytes/token/rank
  //     mb = min(pp, B) micro-batches in flight (each re-reads the stage's weights),
  //     f = 1 - (1 - top_k/E)^(B/mb): expected fraction of experts a micro-batch touches;
  //   flops = B x (2 x active params + attention flops/position x context) / ranks per replica;
  //   step = max(bytes / HBM bandwidth, flops / peak) + comm bytes per rank / link bandwidth
  //     (NVLink inside a node, EFA per GPU = node bandwidth / GPUs per node across; latency ignored);
  //   decode tokens/s per replica = B / step.
  // Prefill: FLOP-bound, 2 x active params + attention at context/2 per token, at peak:
  //   tokens/s per replica = ranks x peak / flops per token. Both are ceilings, not predictions.
  // The peak is the tensor cores' for the GEMMs' operands: bf16 x bf16, or with fp8 weights fp8 x
  // fp8 (W8A8, the CUDA backend's default past 16 rows: prefill and large decode batches).
  const double peak = opt.dtype == WeightDtype::Fp8 ? gpu.fp8_flops : gpu.bf16_flops;
  const int R = l.replica_ranks();
  const double active = double(m.active_params_per_token());
  const double prefill_flops = 2.0 * active + m.attention_flops_per_position(false) * double(opt.context) / 2.0;
  p.prefill_tok_s_replica = double(R) * peak / prefill_flops;
  p.prefill_tok_s = p.prefill_tok_s_replica * p.replicas;
  if (p.max_batch > 0) {
    const double B = double(p.max_batch), Bdp = double(p.max_batch_per_dp);
    const double mb = std::min<double>(l.pp, B);
    p.expert_active_fraction =
        m.moe() ? 1.0 - std::pow(1.0 - double(m.experts_per_token) / double(m.n_routed_experts), B / mb) : 1.0;
    const double dense_w = p.weight_bytes - p.expert_weight_bytes;
    p.decode_bytes_rank = mb * (dense_w + p.expert_active_fraction * p.expert_weight_bytes) +
                          Bdp * double(opt.context) * double(p.kv_bytes_per_token_rank);
    const double decode_flops = 2.0 * active + m.attention_flops_per_position(true) * double(opt.context);
    p.decode_flops_rank = B * decode_flops / R;
    p.decode_mem_s = p.decode_bytes_rank / gpu.hbm_bw;
    p.decode_compute_s = p.decode_flops_rank / peak;
    const double stage_frac = double(p.stage_layers) / double(L);
    double comm = 0;
    comm += Bdp * p.tp_wire_bytes_per_token_rank * stage_frac / (tp_in_node ? gpu.nvlink_bw : efa_gpu);
    if (a2a) {
      const double sent = B * (p.ep_dispatch_bytes_per_token + p.ep_combine_bytes_per_token) * stage_frac / l.ep;
      const int g = std::min(l.ep, gpn);
      comm += sent * double(g - 1) / l.ep / gpu.nvlink_bw + sent * double(l.ep - g) / l.ep / efa_gpu;
    }
    if (l.pp > 1) {
      // Each tp rank hands its dp group's whole residual rows to the next stage.
      comm += B * double(H) * kActivationBytes / l.dp / (p.pp_link == "efa" ? efa_gpu : gpu.nvlink_bw);
    }
    p.decode_comm_s = comm;
    p.decode_step_s = std::max(p.decode_mem_s, p.decode_compute_s) + comm;
    p.decode_bound = p.decode_mem_s >= p.decode_compute_s ? "memory" : "compute";
    p.decode_tok_s_replica = B / p.decode_step_s;
    p.decode_tok_s = p.decode_tok_s_replica * p.replicas;
  }
  return p;
}

Layout default_layout(const ModelFootprint& m, const GpuSpec& gpu, Layout l, const PlanOptions& opt) {
  const int world = l.world();
  if (l.tp <= 0) {
    l.tp = 1;
    for (int t : {8, 4, 2}) {
      const bool ok = t <= l.gpus_per_node && l.gpus_per_node % t == 0 && world % t == 0 && m.heads % t == 0 &&
                      gqa_tp_ok(m, t) && m.vocab % t == 0 && (m.moe_layers == m.layers || m.intermediate % t == 0) &&
                      m.shared_intermediate % t == 0;
      if (ok) {
        l.tp = t;
        break;
      }
    }
  }
  if (l.pp > 0 || l.dp > 0) {
    if (l.pp <= 0) l.pp = 1;
    if (l.dp <= 0) l.dp = 1;
    return l;
  }
  l.pp = l.dp = 1;
  if (world % l.tp != 0) return l;  // plan_layout reports it
  Layout best = l;
  for (int d : divisors(world / l.tp)) {
    Layout c = l;
    (m.moe() ? c.dp : c.pp) = d;
    try {
      LayoutPlan p = plan_layout(m, gpu, c, opt);
      best = c;
      if (p.fits) return c;
    } catch (const Error&) {
    }
  }
  return best;
}

std::vector<LayoutPlan> suggest_layouts(const ModelFootprint& m, const GpuSpec& gpu, int nodes, int gpus_per_node,
                                        const PlanOptions& opt, size_t top) {
  std::vector<LayoutPlan> out;
  const int world = nodes * gpus_per_node;
  for (int tp : {1, 2, 4, 8}) {
    if (tp > gpus_per_node || world % tp) continue;
    for (int pp : divisors(world / tp)) {
      if (pp > m.layers) continue;
      for (int dp : m.moe() ? divisors(world / tp / pp) : std::vector<int>{1}) {
        Layout l{nodes, gpus_per_node, tp, pp, dp, 0};
        try {
          LayoutPlan p = plan_layout(m, gpu, l, opt);
          if (p.fits) out.push_back(std::move(p));
        } catch (const Error&) {
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
    if (a.decode_tok_s != b.decode_tok_s) return a.decode_tok_s > b.decode_tok_s;
    return a.layout.replica_ranks() < b.layout.replica_ranks();
  });
  if (out.size() > top) out.resize(top);
  return out;
}

nlohmann::json footprint_json(const ModelFootprint& m, WeightDtype d) {
  nlohmann::json j;
  j["name"] = m.name;
  j["architecture"] = m.architecture;
  j["model_type"] = m.model_type;
  j["attention"] = m.mla ? "mla" : "gqa";
  j["layers"] = m.layers;
  j["moe_layers"] = m.moe_layers;
  j["n_routed_experts"] = m.n_routed_experts;
  j["experts_per_token"] = m.experts_per_token;
  j["params"] = m.params();
  j["mtp_params"] = m.mtp_params();
  j["active_params_per_token"] = m.active_params_per_token();
  j["dtype"] = to_string(d);
  j["weight_bytes"] = m.bytes(d);
  j["scale_bytes"] = m.scale_bytes(d);
  nlohmann::json comps = nlohmann::json::object();
  for (int i = 0; i < kNumComponents; ++i) {
    const auto c = static_cast<Component>(i);
    comps[to_string(c)] = {{"params", m.params_of(c)}, {"bytes", m.bytes_of(c, d)}};
  }
  j["components"] = comps;
  return j;
}

nlohmann::json to_json(const LayoutPlan& p) {
  const Layout& l = p.layout;
  nlohmann::json j;
  j["layout"] = {{"nodes", l.nodes}, {"gpus_per_node", l.gpus_per_node}, {"world", l.world()},
                 {"tp", l.tp},       {"pp", l.pp},                       {"dp", l.dp},
                 {"ep", l.ep},       {"replicas", p.replicas},           {"ranks_per_replica", l.replica_ranks()}};
  // Per rank (the heaviest pipeline stage).
  j["weight_bytes"] = p.weight_bytes;
  j["expert_weight_bytes"] = p.expert_weight_bytes;
  j["stage_weight_bytes"] = p.stage_weight_bytes;
  j["stage_layers"] = p.stage_layer_counts;
  j["usable_bytes"] = p.usable_bytes;
  j["reserve_bytes"] = p.reserve_bytes;
  j["free_bytes"] = p.free_bytes;
  j["kv_bytes_per_token"] = p.kv_bytes_per_token_rank;
  j["kv_bytes_per_token_model"] = p.kv_bytes_per_token;
  j["kv_capacity_tokens"] = p.kv_capacity_tokens;
  j["max_batch_per_dp"] = p.max_batch_per_dp;
  j["max_batch"] = p.max_batch;
  j["fits"] = p.fits;
  if (!p.fits) j["why_not"] = p.why_not;
  j["comm_bytes_per_token"] = {{"tp_allreduces", p.tp_allreduces_per_token},
                               {"tp_allreduce", p.tp_allreduce_bytes_per_token},
                               {"tp_wire_per_rank", p.tp_wire_bytes_per_token_rank},
                               {"tp_link", p.tp_link},
                               {"ep_dispatch", p.ep_dispatch_bytes_per_token},
                               {"ep_combine", p.ep_combine_bytes_per_token},
                               {"ep_link", p.ep_link},
                               {"pp", p.pp_bytes_per_token},
                               {"pp_link", p.pp_link}};
  j["estimates"] = {{"decode_batch", p.max_batch},
                    {"decode_step_s", p.decode_step_s},
                    {"decode_mem_s", p.decode_mem_s},
                    {"decode_compute_s", p.decode_compute_s},
                    {"decode_comm_s", p.decode_comm_s},
                    {"decode_bound", p.decode_bound},
                    {"expert_active_fraction", p.expert_active_fraction},
                    {"decode_tokens_per_s_replica", p.decode_tok_s_replica},
                    {"decode_tokens_per_s", p.decode_tok_s},
                    {"prefill_tokens_per_s_replica", p.prefill_tok_s_replica},
                    {"prefill_tokens_per_s", p.prefill_tok_s}};
  return j;
}

}  // namespace shardlm::plan
