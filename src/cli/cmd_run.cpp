// shardlm run: the main job. Every rank runs this; its place in the layout decides its part.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <unordered_set>

#include "arch/model.h"
#include "arch/replica_steps.h"
#include "cli/commands.h"
#include "cli/context_limit.h"
#include "cli/unused_tensors.h"
#include "cli/kv_budget.h"
#include "cli/kv_calibration.h"
#include "cli/run_info.h"
#include "cli/run_options.h"
#include "cli/run_identity.h"
#include "cli/run_sessions.h"
#include "cli/run_sinks.h"
#include "compute/backend.h"
#include "compute/op_profile.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/stop_signal.h"
#include "engine/kv_cache.h"
#include "cpu/threads.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"
#include "parallel/communicator.h"
#include "parallel/fabric_preflight.h"
#include "parallel/gpu_binding.h"
#include "parallel/node_local.h"
#include "parallel/op_profile_gather.h"
#include "parallel/layout_groups.h"
#include "parallel/mpi_env.h"
#include "parallel/rank_report.h"
#include "parallel/topology.h"
#include "telemetry/metrics_server.h"
#include "telemetry/metrics_sink.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

namespace {

// Lines in the prompt file, for the progress line's total (a streaming count, memory flat).
int64_t count_lines(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return -1;
  static char buf[1 << 16];
  int64_t n = 0;
  char last = '\n';
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {
    const std::streamsize got = f.gcount();
    for (std::streamsize i = 0; i < got; ++i) n += buf[i] == '\n';
    last = buf[got - 1];
  }
  return n + (last != '\n');
}

// Prompt lines a replica claims at a time: small enough to balance, large enough that claims are rare.
constexpr int64_t kLinesPerClaim = 16;

double seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// Every rank gets rank 0's list (length-prefixed in one buffer).
void share_strings(Communicator* world, std::vector<std::string>* v) {
  if (!world) return;
  std::string buf;
  if (world->rank() == 0) {
    for (const std::string& s : *v) {
      const uint64_t n = s.size();
      buf.append(reinterpret_cast<const char*>(&n), sizeof n);
      buf += s;
    }
  }
  int64_t size = static_cast<int64_t>(buf.size());
  world->broadcast(&size, 1, CommDType::kI64, 0);
  buf.resize(static_cast<size_t>(size));
  world->broadcast(buf.data(), buf.size(), CommDType::kU8, 0);
  if (world->rank() == 0) return;
  v->clear();
  for (size_t at = 0; at + sizeof(uint64_t) <= buf.size();) {
    uint64_t n;
    std::memcpy(&n, buf.data() + at, sizeof n);
    at += sizeof n;
    v->push_back(buf.substr(at, n));
    at += n;
  }
}

RankRecord my_record(const Topology& topo, const Model& model, const ComputeBackend& backend, const LayoutGroups& g,
                     int gpu) {
  RankRecord r;
  r.device = gpu;
  r.rank = topo.world_rank();
  r.replica = topo.coords().replica;
  r.pp = topo.coords().pp;
  r.tp = topo.coords().tp;
  r.dp = topo.coords().dp;
  r.host = MpiEnv::host();
  r.load_bytes = static_cast<int64_t>(model.load_bytes());
  r.load_s = model.load_seconds();
  r.peak_rss_bytes = peak_rss_bytes();
  r.device_weight_bytes = static_cast<int64_t>(backend.device_weight_bytes());
  if (size_t free_b = 0, total_b = 0; backend.device_memory(&free_b, &total_b))
    r.device_used_bytes = static_cast<int64_t>(total_b - free_b);
  if (g.tp) r.tp_bytes_sent = static_cast<int64_t>(g.tp->stats().bytes_sent);
  if (g.pp) r.pp_bytes_sent = static_cast<int64_t>(g.pp->stats().bytes_sent);
  if (g.replica) r.replica_bytes_sent = static_cast<int64_t>(g.replica->stats().bytes_sent);
  if (g.ep) r.ep_bytes_sent = static_cast<int64_t>(g.ep->stats().bytes_sent);
  r.graph_steps = model.graph_steps();
  r.graph_reruns = model.graph_reruns();
  return r;
}

// Whether decode tokens attend on bf16 tensor cores: MLA models only (--decode-attention).
bool mla_decode_bf16(const ModelSpec& spec, const ComputeBackend& backend) {
  return spec.mla.enabled() && backend.decode_attention_bf16();
}

// What carries rank 0's model traffic (its tp, pp or ep group), where the backend says more than
// its name: the libfabric provider, fabric and domain.
std::string comm_transport(const LayoutGroups& g) {
  for (const Communicator* c : {g.tp.get(), g.pp.get(), g.ep.get()})
    if (c && !c->transport().empty()) return c->transport();
  return "";
}

void print_header(const std::vector<RankRecord>& ranks, const Topology& topo, const ModelSpec& spec,
                  const RunOptions& opt, const ComputeBackend& backend, const std::string& transport) {
  std::fprintf(stderr, "[shardlm] shardlm %s (%s); layout %s on %zu rank(s); backend %s%s%s, comm %s%s%s\n",
               SHARDLM_VERSION, SHARDLM_GIT_COMMIT, topo.layout().str().c_str(), ranks.size(), opt.backend.c_str(),
               opt.cuda_graphs ? " (CUDA graphs)" : "",
               !backend.prefill_attention_bf16() ? ""
               : mla_decode_bf16(spec, backend)  ? ", prefill and decode attention on bf16 tensor cores"
                                                 : ", prefill attention on bf16 tensor cores",
               opt.comm.c_str(), transport.empty() ? "" : ": ", transport.c_str());
  for (const auto& [lib, ver] : library_versions()) std::fprintf(stderr, "[shardlm]   %-14s %s\n", lib.c_str(), ver.c_str());
  std::fprintf(
      stderr, "[shardlm] model %s: %s, %lld layers, hidden %lld, %lld heads (%lld KV), vocab %lld%s; KV cache %s\n",
      opt.model.c_str(), spec.architecture.c_str(), static_cast<long long>(spec.num_layers),
      static_cast<long long>(spec.hidden_size), static_cast<long long>(spec.num_heads),
      static_cast<long long>(spec.num_kv_heads), static_cast<long long>(spec.vocab_size),
      !spec.quant.fp8_block ? ""
      : backend.keeps_fp8_weights()
          ? (backend.fp8_w8a8() ? "; fp8 weights kept fp8, prefill W8A8" : "; fp8 weights kept fp8, prefill on bf16")
          : "; fp8 weights dequantised to bf16",
      opt.kv_dtype.c_str());
  // On a device: the memory the rank's weights take there (an fp8 checkpoint's kept fp8, or not).
  bool device = false;
  for (const RankRecord& r : ranks) device = device || r.device_weight_bytes > 0;
  std::fprintf(
      stderr,
      "[shardlm]   rank  host              local  replica  stage  dp  tp  layers     loaded MB  seconds   GB/s%s\n",
      device ? "  device MB" : "");
  for (const RankRecord& r : ranks) {
    const auto [l0, l1] = topo.stage_layers(r.pp);
    std::fprintf(stderr, "[shardlm]   %4d  %-16s  %5d  %7d  %5d  %2d  %2d  [%3d,%3d)  %9.1f  %7.3f  %5.2f", r.rank,
                 r.host.c_str(), r.local_rank, r.replica, r.pp, r.dp, r.tp, l0, l1, r.load_bytes / 1e6, r.load_s,
                 r.load_s > 0 ? r.load_bytes / r.load_s / 1e9 : 0.0);
    if (device) std::fprintf(stderr, "  %9.1f", r.device_weight_bytes / 1e6);
    std::fprintf(stderr, "\n");
  }
}

// --kv-calibrate-out, on every rank at the end of the run (collective over the world): the
// layers' magnitudes, the maximum over every rank, and rank 0 writes the scales.
void finish_kv_calibration(const RunOptions& opt, Communicator* world, const Model& model, int rank) {
  if (opt.kv_calibrate_out.empty()) return;
  const std::vector<float> all = reduce_kv_magnitudes(world, model.kv_magnitudes());
  if (rank != 0) return;
  write_kv_scales(opt.kv_calibrate_out, all);
  if (!opt.quiet) std::fprintf(stderr, "[shardlm] KV cache scales -> %s\n", opt.kv_calibrate_out.c_str());
}

EngineConfig engine_config(const RunOptions& opt, const ModelSpec& spec, const Topology& topo,
                           const std::string& prompts) {
  EngineConfig ec;
  ec.scheduler.max_batch_tokens = opt.max_batch_tokens;
  ec.scheduler.max_seqs = opt.max_seqs;
  ec.scheduler.max_logit_rows = opt.max_logit_rows;
  ec.scheduler.block_size = opt.block_size;
  ec.scheduler.max_model_len = opt.max_model_len;  // what is asked for; resolved once the KV budget is known
  ec.defaults = sampling_defaults(opt);  // checked by parse_run_options
  ec.kv_dtype = resolve_kv_dtype(opt.kv_dtype, spec.torch_dtype);
  ec.progress_interval_s = opt.quiet ? 0 : opt.progress_interval;
  // The progress line's total: the file's lines (a resumed run takes off those it holds, below);
  // with several replicas each counts against an even share of them. Read only where a progress
  // line is printed: not by every rank of a large job, each reading the whole file.
  ec.total_requests = ec.progress_interval_s > 0 && topo.is_replica_leader() ? count_lines(prompts) : -1;
  ec.replicas = topo.layout().engine_groups();
  ec.replica = topo.engine_group();
  if (topo.layout().engine_groups() > 1) ec.lookahead = opt.max_seqs;
  return ec;
}

// An attribute that describes this session where it applies, and is removed where it does not (a
// resumed file may hold one from an earlier session's other model path or layout).
void set_where(ResultWriter& w, const char* name, bool applies, const std::string& value) {
  if (applies)
    w.set_attr(name, value);
  else
    w.remove_attr(name);
}

// How the backend ran what the model does: written at the start, and again at the end, since the
// first large GEMM's self-checks can turn W8A8, the grouped fp8 kernel or wgmma off during the run.
void write_compute_paths(ResultWriter& w, const ModelSpec& spec, const ComputeBackend& backend) {
  // What an fp8 checkpoint's linear weights are in memory: fp8 only where the backend keeps them.
  set_where(w, "fp8_weights", spec.quant.fp8_block, backend.keeps_fp8_weights() ? "fp8" : "bf16");
  // How their prefill linears ran: W8A8 only where the weights stayed fp8.
  set_where(w, "fp8_prefill", spec.quant.fp8_block && backend.keeps_fp8_weights(),
            backend.fp8_w8a8() ? "w8a8" : "bf16");
  // How W8A8 ran the routed experts: in one grouped launch, or one GEMM per expert (none without
  // W8A8, which the end of the run may find off).
  set_where(w, "fp8_expert_gemm",
            spec.quant.fp8_block && backend.keeps_fp8_weights() && backend.fp8_w8a8() && spec.moe.num_experts > 0,
            backend.fp8_grouped_gemm() ? "grouped" : "per-expert");
  // The products the grouped expert GEMMs ran on (a GPU backend's): wgmma or mma.sync.
  set_where(w, "grouped_gemm_core", spec.moe.num_experts > 0 && !backend.grouped_gemm_core().empty(),
            backend.grouped_gemm_core());
  // How prefill chunks attended: on bf16 tensor cores or in fp32 (--prefill-attention).
  w.set_attr("prefill_attention", std::string(backend.prefill_attention_bf16() ? "bf16" : "fp32"));
  // How decode tokens attended: bf16 tensor cores for an MLA model with --decode-attention bf16.
  w.set_attr("decode_attention", std::string(mla_decode_bf16(spec, backend) ? "bf16" : "fp32"));
}

void write_attributes(ResultWriter& w, const RunOptions& opt, const ModelSpec& spec, const Topology& topo,
                      const ComputeBackend& backend, const std::string& transport, int argc, char** argv) {
  w.set_attr("version", std::string(SHARDLM_VERSION));
  w.set_attr("git_commit", std::string(SHARDLM_GIT_COMMIT));
  w.set_attr("command_line", command_line(argc + 1, argv - 1));
  w.set_attr("config", to_ini(opt));
  w.set_attr("model_architecture", spec.architecture);
  w.set_attr("model_config_hash", spec.config_hash);
  w.set_attr("layout", "world=" + std::to_string(topo.layout().world()) + " " + topo.layout().str());
  w.set_attr("backend", opt.backend);
  write_compute_paths(w, spec, backend);
  w.set_attr("comm", opt.comm);
  set_where(w, "comm_transport", !transport.empty(), transport);
  w.set_attr("seed", opt.seed);  // unsigned: a seed past 2^63 reads as itself
  for (const auto& [lib, ver] : library_versions()) w.set_attr("version_" + lib, ver);
}

// The network preflight's findings (README "Network preflight"); "none" where a library is absent.
void write_fabric_attributes(ResultWriter& w, const FabricReport& f) {
  auto or_none = [](const std::string& s) { return s.empty() ? std::string("none") : s; };
  w.set_attr("nodes", static_cast<int64_t>(f.nodes.size()));
  w.set_attr("fabric_providers", or_none(f.providers()));
  w.set_attr("fabric_efa_devices", f.efa_devices());
  w.set_attr("fabric_nccl_net", or_none(f.nccl_net()));
  w.set_attr("fabric_warnings", f.warnings_json());
  w.set_attr("fabric_nodes", f.facts_json());
  w.set_attr("nccl_version", or_none(f.nccl_version()));
  w.set_attr("cuda_runtime_version", or_none(f.cuda_runtime()));
  w.set_attr("cuda_driver_version", or_none(f.cuda_driver()));
  w.set_attr("gpus_per_node", f.gpus_per_node());
}

}  // namespace

int cmd_run(int argc, char** argv) {
  RunOptions opt;
  if (!parse_run_options(argc, argv, &opt)) return 0;
  install_stop_handlers();
  const int rank = MpiEnv::rank(), world = MpiEnv::size();
  cpu::set_num_threads(opt.threads);
  const std::string started = iso_time_now();
  if (rank == 0 && !opt.quiet && !opt.generation_config_taken.empty())
    std::fprintf(stderr, "[shardlm] %s\n", opt.generation_config_taken.c_str());
  if (rank == 0 && !opt.generation_config_not_applied.empty())
    std::fprintf(stderr, "[shardlm] warning: %s\n", opt.generation_config_not_applied.c_str());

  // The network preflight comes first: its report is out before anything that could hang on a bad
  // network (NCCL's bootstrap), and a job on the wrong one (--require-efa) ends here, on every rank.
  FabricReport fabric;
  {
    std::unique_ptr<Communicator> all;
    if (world > 1) {
      std::vector<int> ranks(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) ranks[static_cast<size_t>(r)] = r;
      all = make_communicator("mpi", ranks, "world (fabric preflight)", opt.comm_timeout);
    }
    fabric = fabric_preflight(all.get(), opt.require_efa, fabric_report_mode(opt.fabric_report, world));
  }

  const ModelSpec spec = ModelSpec::load(opt.model);
  check_max_model_len(opt.max_model_len, spec.max_position_embeddings, opt.model);
  // The resolved cache dtype goes into the run's recorded options, so its job file reproduces it.
  opt.kv_dtype = kv_dtype_name(resolve_kv_dtype(opt.kv_dtype, spec.torch_dtype));
  Layout layout{opt.tp, opt.pp, opt.replicas > 0 ? opt.replicas : std::max(1, world / (opt.tp * opt.pp * opt.dp)),
                opt.dp, opt.ep > 0 ? opt.ep : (spec.moe.enabled() && opt.dp > 1 ? opt.dp * opt.tp : 1)};
  Topology topo(layout, rank, world, spec);
  if (!opt.pp_layers.empty()) {
    topo.set_stage_layers(parse_stage_layers(opt.pp_layers, layout.pp, static_cast<int>(spec.num_layers)),
                          static_cast<int>(spec.num_layers));
  }
  // A GPU per rank (round-robin over the node's GPUs by local rank) before any communicator is
  // made: NCCL communicators and staged MPI buffers live on the current device.
  int gpu = -1;
  NodeLocal node;
  if (opt.backend == "cuda" || opt.comm == "nccl") {
    node = node_local(opt.comm_timeout);
    gpu = bind_local_gpu(node);
  }
  LayoutGroups groups = make_layout_groups(topo, opt.comm, opt.comm_timeout);
  // The writer opens its file before any weight is read: a bad output path fails at once, and a
  // resumed file says which requests are done.
  std::unique_ptr<ResultWriter> writer;
  std::vector<std::string> finished, legacy_keys;
  EarlierSessions earlier;  // what a resumed file's earlier sessions hold (rank 0)
  if (rank == 0) {
    const bool resume = opt.resume && std::filesystem::exists(opt.out);
    if (resume) {
      earlier = read_earlier_sessions(opt.out);
      // A context limit the file's run asked for is kept (another one asked for now is refused below).
      if (opt.max_model_len == 0) opt.max_model_len = earlier.max_model_len_asked;
      const std::vector<std::string> diff =
          output_differences(earlier.config, earlier.model_config_hash, to_ini(opt), spec.config_hash);
      if (!diff.empty()) {
        std::string list;
        for (const std::string& d : diff) list += "\n  " + d + " (the file's vs this run's)";
        SHARDLM_FAIL("--resume "
                     << opt.out << ": the file holds the outputs of a run with other settings:" << list
                     << "\nresume with the same model, sampling options and --max-model-len, or write to a new --out");
      }
    }
    // Settings that match do not make another build's rows this one's: said, not refused (a fix
    // between the two is often why a job is resumed).
    if (resume && !earlier.git_commit.empty() && earlier.git_commit != SHARDLM_GIT_COMMIT) {
      std::fprintf(stderr,
                   "[shardlm] warning: --resume %s: its rows were written by shardlm %s (commit %s), this is %s "
                   "(commit %s): where the two differ, so may their rows (a new --out keeps one build's)\n",
                   opt.out.c_str(), earlier.version.c_str(), earlier.git_commit.c_str(), SHARDLM_VERSION,
                   SHARDLM_GIT_COMMIT);
    }
    writer = std::make_unique<ResultWriter>(opt.out, opt.flush_every, resume, opt.flush_seconds);
    if (resume) finished = writer->finished_keys(&legacy_keys);
  }
  // The rows kept, then the keys of rows an older version wrote for lines it could not read.
  int64_t shared[2] = {opt.max_model_len, static_cast<int64_t>(finished.size())};
  finished.insert(finished.end(), legacy_keys.begin(), legacy_keys.end());
  share_strings(groups.world.get(), &finished);
  if (groups.world) groups.world->broadcast(shared, 2, CommDType::kI64, 0);
  opt.max_model_len = shared[0];
  const int64_t kept_rows = shared[1];
  const std::unordered_set<std::string> done(finished.begin(), finished.end());
  // Replicas claim windows of prompt lines from one queue; every rank takes part in its creation.
  std::unique_ptr<LineQueue> queue;
  if (layout.engine_groups() > 1) {
    queue = std::make_unique<LineQueue>(kLinesPerClaim, topo.engine_group(), layout.engine_groups(), opt.comm_timeout);
  }
  const Coords& c = topo.coords();
  const auto [first_layer, last_layer] = topo.stage_layers(c.pp);
  ShardPlan plan = ShardPlan::make(spec, c.tp, layout.tp, c.pp, layout.pp, first_layer, last_layer);
  plan.set_expert_parallel(spec, layout.ep > 1 ? topo.ep_rank() : 0, layout.ep);

  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(opt.model);
  if (!opt.kv_scales.empty()) ckpt->add_file(opt.kv_scales);
  std::unique_ptr<ComputeBackend> backend = make_backend(opt.backend);
  backend->set_keep_fp8_weights(opt.fp8_weights == "fp8");
  backend->set_fp8_w8a8(opt.fp8_prefill == "w8a8");
  backend->set_fp8_grouped_gemm(opt.fp8_expert_gemm == "grouped");
  backend->set_grouped_gemm_wgmma(opt.grouped_gemm_core == "auto");
  const bool prefill_bf16 = prefill_attention_bf16(opt.prefill_attention, spec.torch_dtype, spec.quant.fp8_block);
  backend->set_prefill_attention_bf16(prefill_bf16);
  backend->set_decode_attention_bf16(decode_attention_bf16(opt.decode_attention, prefill_bf16));
  std::unique_ptr<Model> model = build_model(spec, *ckpt, *backend, plan, groups.shard());
  const UnusedTensors unused = find_unused_tensors(*ckpt, groups.world.get());
  if (rank == 0) say_unused_tensors(unused, opt.model);
  const ExpertWire wire = parse_expert_wire(opt.ep_wire);
  model->set_expert_wire(wire);
  // A request with no exchange to apply to: said once, as --cuda-graphs' eager fallback is.
  if (wire != ExpertWire::kF32 && plan.ep_size == 1 && rank == 0)
    std::fprintf(
        stderr,
        "[shardlm] --ep-wire %s: no expert-parallel exchange in this layout (ep 1): nothing is rounded or quantised\n",
        expert_wire_name(wire));
  EngineConfig ec = engine_config(opt, spec, topo, opt.prompts);
  if (ec.total_requests >= 0) ec.total_requests = std::max<int64_t>(0, ec.total_requests - kept_rows);
  ec.lockstep = groups.dp_leaders.get();
  // Before any graph is captured: the profile steps run eagerly, as the largest steps do.
  ProfileResult profile;
  if (kv_budget_profiles(opt.kv_cache_gb, *backend)) {
    profile = run_profile_steps(*model, *backend, topo.is_replica_leader(), ec.scheduler, ec.kv_dtype);
  }
  // After the profile steps, whose made-up tokens must not count.
  if (!opt.kv_calibrate_out.empty()) model->record_kv_magnitudes();
  // --cuda-graphs is a request: a layout or model that cannot replay graphs runs eagerly, and says
  // why once.
  std::string graphs_not_used;
  if (opt.cuda_graphs) {
    graphs_not_used = model->enable_step_graphs(opt.ep_graph_capacity);
    if (!graphs_not_used.empty() && rank == 0)
      std::fprintf(stderr, "[shardlm] --cuda-graphs: every step runs eagerly: %s\n", graphs_not_used.c_str());
  }
  const int sharing = opt.backend == "cuda" ? ranks_sharing_gpu(groups.world.get(), node, gpu) : 1;
  const KvBudget kv_budget = kv_cache_budget(opt.kv_cache_gb, opt.kv_cache_free_fraction, *backend, sharing, profile);
  ec.kv_cache_bytes = kv_budget.bytes;
  const ContextLimit context =
      resolve_context_limit(opt.max_model_len, spec.max_position_embeddings,
                            std::min(model->kv_blocks_fitting(ec.kv_cache_bytes, ec.scheduler.block_size, ec.kv_dtype),
                                     kv_block_cap(spec, ec.scheduler)),
                            ec.scheduler.block_size, groups.world.get());
  if (context.tokens > 0) {
    // Every engine keeps the same limit: the one asked for, or the smallest cache's.
    ec.scheduler.max_model_len = context.tokens;
    ec.context_limited_by_cache = context.by_cache;
  }
  if (rank == 0) say_context_limit(context, spec.max_position_embeddings, earlier.max_model_len);
  // After the profile steps of the KV budget, so only the run's own steps count.
  std::optional<OpProfile> op_profile;
  if (opt.op_profile) backend->set_op_profile(&op_profile.emplace(*backend));

  // Load report: every rank's shard, printed once.
  if (!opt.quiet) {
    const auto records = gather_rank_records(groups.world.get(), my_record(topo, *model, *backend, groups, gpu));
    if (rank == 0) print_header(records, topo, spec, opt, *backend, comm_transport(groups));
  }

  if (!topo.is_replica_leader()) {
    serve_replica_steps(*model, *groups.replica, ec.kv_cache_bytes, ec.scheduler.block_size,
                        kv_block_cap(spec, ec.scheduler), ec.kv_dtype);
    finish_kv_calibration(opt, groups.world.get(), *model, rank);
    if (op_profile) gather_op_profile_rows(groups.world.get(), op_profile_rows(*op_profile, rank));
    gather_rank_records(groups.world.get(), my_record(topo, *model, *backend, groups, gpu));
    return 0;
  }

  // A replica leader: reads its share of the prompts, schedules, samples, and sends results on.
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(opt.model);
  std::unique_ptr<BroadcastingModel> broadcasting;
  Model* leader_model = model.get();
  if (groups.replica) {
    broadcasting = std::make_unique<BroadcastingModel>(*model, *groups.replica);
    leader_model = broadcasting.get();
  }
  Engine engine(*leader_model, *tok, ec);
  if (rank == 0 && !opt.quiet) {
    std::fprintf(stderr,
                 "[shardlm] KV cache on rank 0: %d blocks of %lld tokens (budget %s, %s); context limit %lld tokens\n",
                 engine.kv_blocks(), static_cast<long long>(ec.scheduler.block_size),
                 memory_text(static_cast<double>(kv_budget.bytes)).c_str(), kv_budget.how.c_str(),
                 static_cast<long long>(engine.max_model_len()));
  }
  RequestReader reader(opt.prompts, prompt_format_from_name(opt.format));
  ReaderSource whole_file(reader);
  std::unique_ptr<ClaimingSource> claiming;
  if (queue) claiming = std::make_unique<ClaimingSource>(reader, *queue);
  SkipFinishedSource source(queue ? static_cast<RequestSource&>(*claiming) : whole_file, done);

  if (rank != 0) {
    RemoteSink sink(0, opt.comm_timeout);
    RunStats local = engine.run(source, sink);
    if (broadcasting) broadcasting->finish();
    sink.finish({local.steps, local.preemptions});
    finish_kv_calibration(opt, groups.world.get(), *model, rank);
    if (op_profile) gather_op_profile_rows(groups.world.get(), op_profile_rows(*op_profile, rank));
    gather_rank_records(groups.world.get(), my_record(topo, *model, *backend, groups, gpu));
    return local.interrupted_by ? 128 + local.interrupted_by : 0;
  }

  write_attributes(*writer, opt, spec, topo, *backend, comm_transport(groups), argc, argv);
  write_session_start(*writer, earlier, started);
  // Whether decode steps replayed graphs: what --cuda-graphs got, and why not where it asked.
  writer->set_attr("cuda_graphs", static_cast<int64_t>(opt.cuda_graphs && graphs_not_used.empty()));
  if (!graphs_not_used.empty()) {
    writer->set_attr("cuda_graphs_not_used", graphs_not_used);
  } else {
    writer->remove_attr("cuda_graphs_not_used");
  }
  write_fabric_attributes(*writer, fabric);
  writer->set_attr("kv_cache_blocks", static_cast<int64_t>(engine.kv_blocks()));  // rank 0's
  writer->set_attr("kv_cache_budget_bytes", kv_budget.bytes);
  writer->set_attr("max_model_len", engine.max_model_len());
  writer->set_attr("checkpoint_tensors_not_read", unused.unexpected);
  set_where(*writer, "checkpoint_tensors_not_read_names", unused.unexpected > 0, unused.summary);
  if (kv_budget.profile.tokens > 0) {
    writer->set_attr("kv_cache_profile_tokens", kv_budget.profile.tokens);
    writer->set_attr("kv_cache_profile_bytes", kv_budget.profile.grew_bytes);
  } else {
    writer->remove_attr("kv_cache_profile_tokens");
    writer->remove_attr("kv_cache_profile_bytes");
  }
  if (kept_rows > 0) writer->set_attr("resumed_with_requests", kept_rows);
  // How the replicas shared the prompt file: claimed as they went, or in turn (LineQueue).
  set_where(*writer, "prompt_line_windows", queue != nullptr,
            queue && queue->on_demand() ? "on-demand" : "round-robin");
  RunStats stats = earlier.stats;  // every replica's requests, every session's
  Metrics metrics;
  MetricsSink metrics_sink(metrics, opt.metrics_file, 5.0);
  WriterSink sink(*writer, stats, finished, metrics_sink);
  std::unique_ptr<MetricsServer> metrics_server;
  if (opt.metrics_port >= 0) {
    metrics_server = std::make_unique<MetricsServer>(metrics, opt.metrics_bind, opt.metrics_port);
    std::fprintf(stderr, "[shardlm] metrics at http://%s:%d/metrics\n", opt.metrics_bind.c_str(),
                 metrics_server->port());
  }
  std::vector<int> leaders = topo.replica_leaders();
  leaders.erase(leaders.begin());  // all but this rank
  ReplicaCollector collector(sink, leaders, opt.comm_timeout);
  PollingSink polling(sink, collector);
  const auto t_run = std::chrono::steady_clock::now();
  RunStats local = engine.run(source, polling);
  if (broadcasting) broadcasting->finish();
  collector.drain();
  metrics_sink.finish();
  stats.wall_s = earlier.stats.wall_s + seconds(t_run);
  stats.steps = earlier.stats.steps + local.steps + collector.totals().steps;
  stats.preemptions = earlier.stats.preemptions + local.preemptions + collector.totals().preemptions;

  finish_kv_calibration(opt, groups.world.get(), *model, rank);
  if (op_profile) {
    writer->write_op_profile(gather_op_profile_rows(groups.world.get(), op_profile_rows(*op_profile, rank)));
    std::string tables;
    for (const std::string& kind : op_profile->kinds())
      tables += format_op_profile(op_profile->totals(kind), "op profile of rank 0, " + kind + " steps");
    std::fprintf(stderr, "[shardlm] %s(every rank's in /op_profile)\n", tables.c_str());
  }
  const std::vector<RankRecord> ranks =
      gather_rank_records(groups.world.get(), my_record(topo, *model, *backend, groups, gpu));
  int64_t load_bytes = 0;
  for (const RankRecord& r : ranks) load_bytes += r.load_bytes;
  writer->set_attr("load_bytes", load_bytes);
  writer->set_attr("load_seconds", model->load_seconds());
  writer->write_ranks(ranks);
  write_compute_paths(*writer, spec, *backend);  // as the self-checks left them
  const int sig = local.interrupted_by;
  write_summary(*writer, stats, sig);
  writer->close();
  if (sig) {
    std::fprintf(stderr,
                 "[shardlm] stopped by signal %d: %s; %s holds every finished request (rerun with --resume to "
                 "finish)\n",
                 sig, stats.summary().c_str(), opt.out.c_str());
    return 128 + sig;
  }
  std::fprintf(stderr, "[shardlm] done: %s -> %s", stats.summary().c_str(), opt.out.c_str());
  if (earlier.sessions > 0)
    std::fprintf(stderr, " (over %lld sessions; %lld requests from the earlier ones)",
                 static_cast<long long>(earlier.sessions + 1), static_cast<long long>(earlier.rows));
  std::fprintf(stderr, "\n");
  return 0;
}

}  // namespace shardlm
