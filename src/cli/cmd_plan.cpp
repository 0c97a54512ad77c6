// shardlm plan: capacity planning for a model on a set of GPU nodes, without touching a GPU. Reads
// config.json directly (dense, MoE and MLA architectures), counts every weight tensor, and for a
// layout (tp x pp x dp, ep) reports per-rank weight bytes, KV-cache room, communication per token
// and roofline throughput ceilings, then suggests the layouts that fit, best first.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "arch/expert_wire.h"
#include "cli/commands.h"
#include "cli/subcommand.h"
#include "core/error.h"
#include "plan/gpu_specs.h"
#include "plan/layout_plan.h"
#include "plan/model_footprint.h"

namespace po = boost::program_options;

namespace shardlm {

namespace {

using namespace plan;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string gb(double b) { return fmt("%.2f GB", b / 1e9); }
std::string bparams(double n) { return n >= 1e12 ? fmt("%.3f T", n / 1e12) : n >= 1e9 ? fmt("%.2f B", n / 1e9) : fmt("%.2f M", n / 1e6); }
std::string grouped(int64_t n) {
  std::string s = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return (n < 0 ? "-" : "") + out;
}
std::string rate(double v) { return v >= 1e6 ? fmt("%.2fM", v / 1e6) : v >= 1e3 ? fmt("%.1fk", v / 1e3) : fmt("%.1f", v); }

void print_human(const ModelFootprint& m, const GpuSpec& gpu, const LayoutPlan& p, const PlanOptions& opt,
                 const std::vector<LayoutPlan>& sugg) {
  const Layout& l = p.layout;
  std::printf("model     %s: %s (%s), %lld layers, hidden %lld, %s", m.name.c_str(), m.architecture.c_str(),
              m.model_type.c_str(), (long long)m.layers, (long long)m.hidden, m.mla ? "MLA" : "GQA");
  if (m.moe())
    std::printf(", MoE %lld experts (top %lld) in %lld layers", (long long)m.n_routed_experts,
                (long long)m.experts_per_token, (long long)m.moe_layers);
  std::printf("\nparams    %s total, %s active per token", bparams(double(m.params())).c_str(),
              bparams(double(m.active_params_per_token())).c_str());
  if (m.mtp_layers) std::printf(" (+ %s in %lld MTP layer(s), not counted)", bparams(double(m.mtp_params())).c_str(), (long long)m.mtp_layers);
  std::printf("\nweights   %s %s", to_string(opt.dtype), gb(m.bytes(opt.dtype)).c_str());
  if (opt.dtype == WeightDtype::Fp8)
    std::printf(" (matrices fp8 e4m3 + %s of fp32 %lldx%lld block scales; embedding, lm_head, norms, router bf16)",
                gb(m.scale_bytes(opt.dtype)).c_str(), (long long)m.block_rows, (long long)m.block_cols);
  std::printf("\n  %-16s %12s %12s\n", "component", "params", "bytes");
  for (int i = 0; i < kNumComponents; ++i) {
    const auto c = static_cast<Component>(i);
    if (m.params_of(c) == 0) continue;
    std::printf("  %-16s %12s %12s\n", to_string(c), bparams(double(m.params_of(c))).c_str(), gb(m.bytes_of(c, opt.dtype)).c_str());
  }

  std::printf("\nlayout    %d node(s) x %d %s = %d ranks: %s, %d replica(s) of %d ranks\n", l.nodes, l.gpus_per_node,
              gpu.name.c_str(), l.world(), layout_name(l).c_str(), p.replicas, l.replica_ranks());
  if (l.pp > 1) {
    std::printf("          layers per stage:");
    for (auto n : p.stage_layer_counts) std::printf(" %lld", (long long)n);
    std::printf("\n");
  }
  std::printf("per rank (heaviest pipeline stage)\n");
  std::printf("  HBM usable       %12s  (%.2f x %.0f GB, %s)\n", gb(p.usable_bytes).c_str(), opt.hbm_fraction,
              gpu.hbm_bytes / 1e9, gpu.description.c_str());
  std::printf("  weights          %12s", gb(p.weight_bytes).c_str());
  if (m.moe()) std::printf("  (routed experts %s, 1/%d of them)", gb(p.expert_weight_bytes).c_str(), l.ep);
  std::printf("\n  reserve          %12s  (activations, workspaces, NCCL buffers: --reserve-gib)\n", gb(p.reserve_bytes).c_str());
  std::printf("  free for KV      %12s\n", gb(p.free_bytes).c_str());
  const double kvb = opt.kv_dtype == WeightDtype::Fp8 ? 1 : 2;
  if (m.mla)
    std::printf("  KV bytes/token   %12s  (model: %s = MLA latent %lld + rope %lld values x %.0f B x %lld layers; "
                "replicated over tp %d, split over pp)\n",
                grouped(p.kv_bytes_per_token_rank).c_str(), grouped(p.kv_bytes_per_token).c_str(),
                (long long)m.kv_lora_rank, (long long)m.qk_rope_head_dim, kvb, (long long)m.layers, l.tp);
  else
    std::printf("  KV bytes/token   %12s  (model: %s = 2 x %lld kv heads x %lld x %.0f B x %lld layers; heads split "
                "over tp %d, layers over pp)\n",
                grouped(p.kv_bytes_per_token_rank).c_str(), grouped(p.kv_bytes_per_token).c_str(),
                (long long)m.kv_heads, (long long)m.head_dim, kvb, (long long)m.layers, l.tp);
  std::printf("  KV capacity      %12s  tokens per dp group -> max batch %lld per dp group, %lld per replica at "
              "context %lld\n",
              grouped(p.kv_capacity_tokens).c_str(), (long long)p.max_batch_per_dp, (long long)p.max_batch,
              (long long)opt.context);
  std::printf("  fits             %12s%s%s\n", p.fits ? "yes" : "NO", p.fits ? "" : "  ", p.why_not.c_str());

  std::printf("communication per token\n");
  if (p.tp_allreduces_per_token)
    std::printf("  tp all-reduce    %lld x %lld x 4 B = %.2f MB (ring: %.2f MB sent per rank) over %s\n",
                (long long)p.tp_allreduces_per_token, (long long)m.hidden, p.tp_allreduce_bytes_per_token / 1e6,
                p.tp_wire_bytes_per_token_rank / 1e6, p.tp_link.c_str());
  else
    std::printf("  tp all-reduce    -\n");
  if (p.ep_dispatch_bytes_per_token > 0)
    std::printf(
        "  ep all-to-all    %lld layers, top %lld, rows of %lld: dispatch in %s %.2f MB (a row per owner rank, "
        "at most) + combine in %s %.2f MB (a row per expert) over %s\n",
        (long long)m.moe_layers, (long long)m.experts_per_token, (long long)m.hidden, expert_wire_name(opt.ep_wire),
        p.ep_dispatch_bytes_per_token / 1e6, expert_wire_name(combine_wire(opt.ep_wire)),
        p.ep_combine_bytes_per_token / 1e6, p.ep_link.c_str());
  else if (m.moe() && l.ep > 1)
    std::printf("  ep all-to-all    - (ep %d <= tp %d: experts inside the tp group, summed by the all-reduce)\n", l.ep, l.tp);
  else
    std::printf("  ep all-to-all    -\n");
  if (l.pp > 1)
    std::printf("  pp activations   %d boundaries x %lld x 4 B = %.3f MB over %s\n", l.pp - 1, (long long)m.hidden,
                p.pp_bytes_per_token / 1e6, p.pp_link.c_str());
  else
    std::printf("  pp activations   -\n");

  std::printf("estimates (roofline ceilings, not measurements; decode at max batch, every sequence at full context)\n");
  if (p.max_batch > 0)
    std::printf("  decode  batch %lld: step %.2f ms = max(HBM %.2f ms, compute %.2f ms) + comm %.2f ms, %s-bound%s"
                "\n          -> %s tokens/s per replica, %s tokens/s in all\n",
                (long long)p.max_batch, p.decode_step_s * 1e3, p.decode_mem_s * 1e3, p.decode_compute_s * 1e3,
                p.decode_comm_s * 1e3, p.decode_bound.c_str(),
                m.moe() ? fmt("; experts touched per micro-batch %.0f%%", p.expert_active_fraction * 100).c_str() : "",
                rate(p.decode_tok_s_replica).c_str(), rate(p.decode_tok_s).c_str());
  else
    std::printf("  decode  - (no request of %lld tokens fits)\n", (long long)opt.context);
  const bool fp8 = opt.dtype == WeightDtype::Fp8;
  std::printf(
      "  prefill %s tokens/s per replica, %s tokens/s in all (at the %s peak %.0f TFLOP/s per GPU: the GEMMs "
      "run %s)\n",
      rate(p.prefill_tok_s_replica).c_str(), rate(p.prefill_tok_s).c_str(), fp8 ? "fp8" : "bf16",
      (fp8 ? gpu.fp8_flops : gpu.bf16_flops) / 1e12,
      fp8 ? "W8A8 on fp8 tensor cores, activations quantised per 128 features" : "bf16");

  std::printf("suggestions (layouts of these %d ranks that fit, best estimated decode tokens/s first)\n", l.world());
  if (sugg.empty()) {
    std::printf("  none fits: add nodes%s, or a shorter --context\n",
                opt.dtype == WeightDtype::Fp8 ? "" : ", use --dtype fp8");
    return;
  }
  std::printf("  %-28s %8s %12s %14s %8s %12s %12s\n", "layout", "replicas", "weights/rank", "KV tokens/rank",
              "batch", "decode tok/s", "prefill tok/s");
  for (const auto& s : sugg)
    std::printf("  %-28s %8d %12s %14s %8lld %12s %12s\n", layout_name(s.layout).c_str(), s.replicas,
                gb(s.weight_bytes).c_str(), grouped(s.kv_capacity_tokens).c_str(), (long long)s.max_batch * s.replicas,
                rate(s.decode_tok_s).c_str(), rate(s.prefill_tok_s).c_str());
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  std::string model, gpu_name = "h200", dtype, kv_dtype = "bf16", wire = "fp32";
  int nodes = 1, gpn = 0, tp = 0, pp = 0, dp = 0, ep = 0, top = 5;
  long long context = 8192;
  PlanOptions opt;
  double reserve_gib = opt.reserve_bytes / double(1ull << 30);
  po::options_description d("shardlm plan options");
  // clang-format off
  d.add_options()("model", po::value(&model), "model directory or config.json")(
      "nodes", po::value(&nodes)->default_value(nodes), "nodes")(
      "gpus-per-node", po::value(&gpn), "GPUs per node (default: the GPU's usual node, 8)")(
      "gpu", po::value(&gpu_name)->default_value(gpu_name), "GPU kind: h200, h100")(
      "tp", po::value(&tp), "tensor-parallel ranks (default: the largest of 8,4,2,1 that divides)")(
      "pp", po::value(&pp), "pipeline stages (default 1, or the smallest that fits for dense models)")(
      "dp", po::value(&dp), "attention data-parallel groups per replica (default 1, or the smallest that fits for MoE)")(
      "ep", po::value(&ep), "expert-parallel ranks (default dp x tp)")(
      "dtype", po::value(&dtype), "weights: fp8 | bf16 (default: the checkpoint's)")(
      "kv-dtype", po::value(&kv_dtype)->default_value(kv_dtype), "KV cache: bf16 | fp8")(
      "ep-wire", po::value(&wire)->default_value(wire),
      "rows in the ep all-to-alls, as shardlm run --ep-wire: fp32 | bf16 | fp8")(
      "context", po::value(&context)->default_value(context), "tokens per request (prompt + output)")(
      "hbm-fraction", po::value(&opt.hbm_fraction)->default_value(opt.hbm_fraction),
      "fraction of the marketed HBM capacity usable")(
      "reserve-gib", po::value(&reserve_gib)->default_value(reserve_gib),
      "GiB per GPU kept for activations and workspaces")(
      "top", po::value(&top)->default_value(top), "suggestions to list")("json", "one JSON object on stdout");
  // clang-format on
  po::variables_map vm;
  if (!parse_subcommand(argc, argv, "plan",
                        "shardlm plan --model DIR|config.json --nodes N [--gpus-per-node 8] [--gpu h200] [--tp T --pp P "
                        "--dp D --ep E] [--dtype fp8|bf16] [--kv-dtype bf16|fp8] [--context 8192] [--json]",
                        d, &vm))
    return 0;
  SHARDLM_CHECK(!model.empty(), "shardlm plan: --model is required");
  SHARDLM_CHECK(reserve_gib >= 0, "shardlm plan: --reserve-gib " << reserve_gib << " must be >= 0");
  SHARDLM_CHECK(top >= 0, "shardlm plan: --top " << top << " must be >= 0");
  const GpuSpec& gpu = gpu_spec(gpu_name);
  ModelFootprint m = ModelFootprint::load(model);
  opt.dtype = dtype.empty() ? (m.native_fp8 ? WeightDtype::Fp8 : WeightDtype::Bf16) : parse_weight_dtype(dtype);
  opt.kv_dtype = parse_weight_dtype(kv_dtype);
  opt.ep_wire = parse_expert_wire(wire);
  opt.context = context;
  opt.reserve_bytes = reserve_gib * double(1ull << 30);
  if (gpn <= 0) gpn = gpu.gpus_per_node;
  SHARDLM_CHECK(nodes >= 1, "shardlm plan: --nodes " << nodes << " must be >= 1");
  Layout l{nodes, gpn, tp, pp, dp, ep};
  l = default_layout(m, gpu, l, opt);
  LayoutPlan p = plan_layout(m, gpu, l, opt);
  std::vector<LayoutPlan> sugg = suggest_layouts(m, gpu, nodes, gpn, opt, static_cast<size_t>(top));
  if (vm.count("json")) {
    nlohmann::json j = to_json(p);
    j["model"] = footprint_json(m, opt.dtype);
    j["gpu"] = {{"name", gpu.name},           {"hbm_bytes", gpu.hbm_bytes}, {"hbm_fraction", opt.hbm_fraction},
                {"hbm_bw", gpu.hbm_bw},       {"bf16_flops", gpu.bf16_flops}, {"fp8_flops", gpu.fp8_flops},
                {"nvlink_bw", gpu.nvlink_bw}, {"node_net_bw", gpu.node_net_bw}};
    j["options"] = {{"dtype", to_string(opt.dtype)},
                    {"kv_dtype", to_string(opt.kv_dtype)},
                    {"ep_wire", expert_wire_name(opt.ep_wire)},
                    {"context", opt.context}};
    nlohmann::json s = nlohmann::json::array();
    for (const auto& x : sugg) s.push_back(to_json(x));
    j["suggestions"] = s;
    std::cout << j.dump(2) << "\n";
  } else {
    print_human(m, gpu, p, opt, sugg);
  }
  return 0;
}

}  // namespace shardlm
