// shardlm bench-moe: one Mixture-of-Experts layer with expert parallelism over the ranks of the
// job, phase by phase (route, dispatch, expert GEMMs, combine, shared expert), beside this
// machine's ceilings (fp32 FMA peak for the GEMMs; an all-to-all of the same bytes and the memory
// bandwidth for dispatch/combine) and published figures for context.
//
//   mpirun -np EP shardlm bench-moe [--hidden 1024] [--experts 64] [--inter 256] [--top-k 8]
//                                   [--groups 8] [--topk-groups 4] [--shared 1] [--tokens 128,4096]
//
// The defaults are DeepSeek-V3's layer (hidden 7168, 256 experts of 2048, top-8, sigmoid routing
// over 8 groups keeping 4, one shared expert) scaled down to fit a small machine. Weights are
// random, generated in memory; each rank holds experts/EP whole experts and its own tokens
// (--tokens per rank), exactly as the MoE block runs them (arch/expert_dispatch.h).
#include <algorithm>
#include <boost/program_options.hpp>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "arch/expert_wire.h"
#include "arch/model.h"
#include "arch/scratch.h"
#include "cli/bench_moe_layer.h"
#include "cli/commands.h"
#include "cli/subcommand.h"
#include "compute/backend.h"
#include "core/error.h"
#include "cpu/expert_exchange.h"
#include "cpu/threads.h"
#include "model/model_spec.h"
#include "parallel/communicator.h"
#include "parallel/mpi_env.h"

namespace po = boost::program_options;

namespace shardlm {

namespace {

using namespace bench_moe;

std::vector<int64_t> parse_tokens(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    char* stop = nullptr;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    SHARDLM_CHECK(!item.empty() && stop && *stop == '\0' && v >= 0,
                  "shardlm bench-moe: --tokens: cannot read '" << item << "' as a token count");
    out.push_back(v);
    start = end + 1;
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

po::options_description describe(Options& o) {
  po::options_description d("shardlm bench-moe options");
  d.add_options()("hidden", po::value(&o.H)->default_value(o.H), "hidden size")(
      "experts", po::value(&o.E)->default_value(o.E), "routed experts (a multiple of the rank count)")(
      "inter", po::value(&o.I)->default_value(o.I), "intermediate size of each routed expert")(
      "top-k", po::value(&o.k)->default_value(o.k), "experts per token")(
      "groups", po::value(&o.groups)->default_value(o.groups), "expert groups (sigmoid routing; 1: no group limit)")(
      "topk-groups", po::value(&o.topk_groups)->default_value(o.topk_groups), "groups kept per token")(
      "shared", po::value(&o.shared)->default_value(o.shared), "shared experts (each of --inter), 0: none")(
      "scoring", po::value(&o.scoring)->default_value(o.scoring), "sigmoid (DeepSeek-V3) or softmax (Mixtral/Qwen)")(
      "routed-scaling", po::value(&o.scale)->default_value(o.scale), "routed_scaling_factor (sigmoid routing)")(
      "tokens", po::value(&o.tokens_text)->default_value(o.tokens_text), "tokens per rank, a comma list")(
      "dtype", po::value(&o.dtype)->default_value(o.dtype),
      "expert weight type: bf16, f32 or fp8 (e4m3, 128 x 128 block scales: kept fp8 on the GPU)")(
      "iters,n", po::value(&o.iters)->default_value(o.iters), "timed iterations per token count")(
      "warmup,w", po::value(&o.warmup)->default_value(o.warmup), "untimed iterations per token count")(
      "threads", po::value(&o.threads)->default_value(o.threads), "CPU threads per rank (0: cores / ranks)")(
      "backend", po::value(&o.backend_name)->default_value(o.backend_name), "compute backend: cpu or cuda")(
      "comm", po::value(&o.comm_name)->default_value(o.comm_name), "communicator of the ep group: mpi, fabric or nccl")(
      "timeout", po::value(&o.timeout)->default_value(o.timeout),
      "seconds any rank waits for its peers before failing")(
      "fp8-prefill", po::value(&o.fp8_prefill)->default_value(o.fp8_prefill),
      "--dtype fp8 on --backend cuda: expert groups of more than 16 rows as W8A8 block-scaled fp8 GEMMs (w8a8) or on "
      "the weight dequantised to bf16 (bf16), as shardlm run")(
      "fp8-expert-gemm", po::value(&o.fp8_expert_gemm)->default_value(o.fp8_expert_gemm),
      "with --fp8-prefill w8a8: those groups in one grouped W8A8 launch on fp8 tensor cores (grouped) or one cuBLASLt "
      "GEMM per expert (per-expert), as shardlm run")(
      "plan-ep", po::value(&o.plan_ep)->default_value(o.plan_ep),
      "the ep group a captured exchange's index plans are timed for, on each rank's routing (any rank count; 0: "
      "skip)")(
      "routed-gemm", po::value(&o.routed_gemm)->default_value(o.routed_gemm),
      "--backend cuda, bf16 experts: the routed GEMMs (a CUDA graph's, from device offsets) of more than 16 rows an "
      "expert on average in one grouped GEMM on bf16 tensor cores (grouped) or through the direct kernel (direct)")(
      "grouped-gemm-core", po::value(&o.grouped_gemm_core)->default_value(o.grouped_gemm_core),
      "--backend cuda: those grouped GEMMs on Hopper's wgmma where the GPU has it and its self-check agrees (auto) or "
      "on mma.sync always (mma-sync), as shardlm run")(
      "gate-up", po::value(&o.gate_up)->default_value(o.gate_up),
      "each expert's gate and up read as one weight, one grouped call for both, where the backend can place them one "
      "after another (stacked, as shardlm run) or left apart (apart)")(
      "ep-wire", po::value(&o.wire_name)->default_value(o.wire_name),
      "rows between ranks in dispatch and combine: fp32, bf16 (half the bytes) or fp8 (dispatch rows in e4m3 "
      "with a scale per 128 values, combine in bf16), as shardlm run --ep-wire");
  return d;
}

// Reads and checks the command line into *out. Returns false after printing the help (--help).
bool parse_options(int argc, char** argv, Options* out) {
  Options o;
  po::options_description d = describe(o);
  po::variables_map vm;
  if (!parse_subcommand(argc, argv, "bench-moe",
                        "mpirun -np EP shardlm bench-moe [--hidden 1024] [--experts 64] [--inter 256] [--top-k 8] "
                        "[--tokens 128,4096]",
                        d, &vm))
    return false;
  o.tokens = parse_tokens(o.tokens_text);
  SHARDLM_CHECK(o.dtype == "bf16" || o.dtype == "f32" || o.dtype == "fp8",
                "shardlm bench-moe: --dtype must be bf16, f32 or fp8, not '" << o.dtype << "'");
  SHARDLM_CHECK(o.fp8_prefill == "w8a8" || o.fp8_prefill == "bf16",
                "shardlm bench-moe: --fp8-prefill must be w8a8 or bf16, not '" << o.fp8_prefill << "'");
  SHARDLM_CHECK(
      o.fp8_expert_gemm == "grouped" || o.fp8_expert_gemm == "per-expert",
      "shardlm bench-moe: --fp8-expert-gemm must be grouped or per-expert, not '" << o.fp8_expert_gemm << "'");
  SHARDLM_CHECK(o.routed_gemm == "grouped" || o.routed_gemm == "direct",
                "shardlm bench-moe: --routed-gemm must be grouped or direct, not '" << o.routed_gemm << "'");
  SHARDLM_CHECK(o.grouped_gemm_core == "auto" || o.grouped_gemm_core == "mma-sync",
                "shardlm bench-moe: --grouped-gemm-core must be auto or mma-sync, not '" << o.grouped_gemm_core << "'");
  SHARDLM_CHECK(o.gate_up == "stacked" || o.gate_up == "apart",
                "shardlm bench-moe: --gate-up must be stacked or apart, not '" << o.gate_up << "'");
  o.wire = parse_expert_wire(o.wire_name);
  SHARDLM_CHECK(o.scoring == "sigmoid" || o.scoring == "softmax",
                "shardlm bench-moe: --scoring must be sigmoid or softmax, not '" << o.scoring << "'");
  SHARDLM_CHECK(o.H > 0 && o.E > 0 && o.I > 0 && o.k > 0 && o.k <= o.E && o.shared >= 0,
                "shardlm bench-moe: sizes must be positive and --top-k at most --experts");
  SHARDLM_CHECK(o.iters >= 1 && o.warmup >= 0, "shardlm bench-moe: --iters must be >= 1 and --warmup >= 0");
  *out = std::move(o);
  return true;
}

void print_header(const Options& o, const Layer& layer) {
  const int n = layer.n;
  const Ceilings& c = layer.ceilings;
  const MoeSpec& m = layer.m;
  std::printf("# shardlm bench-moe: %d rank%s (ep %d, %" PRId64 " experts per rank), %d threads per rank, %s backend\n",
              n, n == 1 ? "" : "s", n, layer.L, cpu::num_threads(), layer.backend->name().c_str());
  std::printf("# MPI library: %s\n", MpiEnv::library_version().c_str());
  std::printf("# ep group on %s%s%s\n", o.comm_name.c_str(), layer.comm->transport().empty() ? "" : ": ",
              layer.comm->transport().c_str());
  std::printf("# layer: hidden %" PRId64 ", %" PRId64 " routed experts x intermediate %" PRId64 " (%s), top-%" PRId64
              ", %s routing",
              o.H, o.E, o.I, o.dtype.c_str(), o.k, o.scoring.c_str());
  if (m.scoring == MoeSpec::Scoring::kSigmoid)
    std::printf(" (%" PRId64 " groups, best %" PRId64 " kept, bias, scaling %.2f)", m.n_group, m.topk_group, o.scale);
  std::printf(", %" PRId64 " shared expert%s (intermediate %" PRId64 ")\n", o.shared, o.shared == 1 ? "" : "s",
              layer.S);
  std::printf("# activations on the wire (--ep-wire %s): dispatch one %s row (%" PRId64
              " B + slots) per (token, destination rank), combine one %s row (%" PRId64 " B) per (token, expert)\n",
              expert_wire_name(o.wire), expert_wire_name(o.wire), wire_block_bytes(o.wire, o.H, o.H, o.H),
              expert_wire_name(combine_wire(o.wire)), wire_block_bytes(combine_wire(o.wire), o.H, o.H, o.H));
  if (c.gpu) {
    std::printf("# ceilings: %s\n", c.device_text.c_str());
  } else {
    std::printf(
        "# ceilings: %d cores; fp32 FMA peak %.1f GFLOP/s for one rank's threads alone, %.1f GFLOP/s per "
        "rank when all run (cores shared); memory bandwidth %.1f GB/s\n",
        layer.hw, c.peak_alone, c.peak_rank, c.membw);
  }
  std::printf("# times: median over %d iterations on each rank, the slowest rank shown (fastest in brackets)\n#\n",
              o.iters);
  std::printf("# %9s  %-13s %11s %11s  %s\n", "tok/rank", "phase", "median(us)", "[fastest]", "detail");
}

// Every rank's Fields of one token count, as rank 0 prints them.
struct Gathered {
  int n = 1;
  std::vector<int64_t> all;  // [n * kFields], rank q's Field f at q * kFields + f

  std::vector<int64_t> field(int f) const {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) v[q] = all[static_cast<size_t>(q * kFields + f)];
    return v;
  }
  int64_t slowest(int f) const {
    auto v = field(f);
    return *std::max_element(v.begin(), v.end());
  }
  int64_t fastest(int f) const {
    auto v = field(f);
    return *std::min_element(v.begin(), v.end());
  }
};

// This rank's figures into Fields (integers: the communicator has no f64), gathered from every rank.
Gathered gather_fields(Communicator& comm, const Figures& fig) {
  const std::vector<std::vector<double>>& t = fig.t;
  Gathered g;
  g.n = comm.size();
  g.all.resize(static_cast<size_t>(kFields * g.n));
  std::vector<int64_t> mine(kFields, 0);
  for (int f = kRoute; f <= kRouted; ++f) mine[f] = static_cast<int64_t>(median(t[f]) * 1e9);
  mine[kDispatchBytes] = fig.dbytes;
  mine[kCombineBytes] = fig.cbytes;
  mine[kRows] = fig.rows;
  mine[kWeightBytes] = fig.wbytes;
  mine[kCaptured] = t[kCaptured].empty() ? 0 : static_cast<int64_t>(median(t[kCaptured]) * 1e9);
  mine[kCapturedDispatchBytes] = fig.cap_dbytes;
  mine[kCapturedCombineBytes] = fig.cap_cbytes;
  mine[kOverflows] = fig.overflows;
  mine[kCapturedNodes] = fig.cap_nodes;
  mine[kPlans] = t[kPlans].empty() ? 0 : static_cast<int64_t>(median(t[kPlans]) * 1e9);
  mine[kWire] = t[kWire].empty() ? 0 : static_cast<int64_t>(median(t[kWire]) * 1e9);
  mine[kWireRows] = t[kWireRows].empty() ? 0 : static_cast<int64_t>(median(t[kWireRows]) * 1e9);
  comm.all_gather(mine.data(), g.all.data(), kFields, CommDType::kI64);
  return g;
}

double us(int64_t ns) { return static_cast<double>(ns) / 1e3; }

double per_ns(double amount, int64_t ns) { return ns > 0 ? amount / static_cast<double>(ns) : 0.0; }

// Dispatch / combine: mean bytes a rank sends to its peers (MB); the slowest rank's rate.
std::pair<double, double> rate(const Gathered& g, int bytes_field, int time_field) {
  const auto bytes = g.field(bytes_field), ns = g.field(time_field);
  double worst = -1, sum = 0;
  for (int q = 0; q < g.n; ++q) {
    sum += static_cast<double>(bytes[q]);
    const double r = per_ns(static_cast<double>(bytes[q]), ns[q]);
    if (worst < 0 || r < worst) worst = r;
  }
  return std::make_pair(sum / g.n / 1e6, worst);
}

void print_line(int64_t T, const char* phase, const Gathered& g, int f, const std::string& detail) {
  std::printf("  %9" PRId64 "  %-13s %11.1f %11.1f  %s\n", T, phase, us(g.slowest(f)), us(g.fastest(f)),
              detail.c_str());
}

std::string dispatch_detail(const Gathered& g, int64_t block_bytes, double membw) {
  const int n = g.n;
  char buf[1024];
  if (n > 1) {
    const auto [mb, gbs] = rate(g, kDispatchBytes, kDispatch);
    const double a2a_gbs = per_ns(static_cast<double>(block_bytes) * (n - 1), g.slowest(kA2a));
    std::snprintf(buf, sizeof buf,
                  "%.2f MB/rank to peers, %.2f GB/s (all_to_all of the same bytes: %.1f us, %.2f GB/s; "
                  "memory %.1f GB/s)",
                  mb, gbs, us(g.slowest(kA2a)), a2a_gbs, membw);
  } else {
    std::snprintf(buf, sizeof buf, "one rank: rows gathered per expert in memory, nothing sent");
  }
  return buf;
}

// Few rows per expert (decode) are bound by reading the experts' weights, many by the FMA peak:
// both rates, on the slowest rank.
std::string gemm_detail(const Options& o, const Ceilings& c, const Gathered& g, const std::string& gemm_path) {
  const int n = g.n;
  const int64_t H = o.H, I = o.I;
  const double membw = c.membw;
  const auto rw = g.field(kRows), gt = g.field(kGemm), wb = g.field(kWeightBytes);
  int64_t rmin = rw[0], rmax = rw[0], rsum = 0;
  double worst_gflops = -1, worst_gbs = -1;
  for (int q = 0; q < n; ++q) {
    rmin = std::min(rmin, rw[q]);
    rmax = std::max(rmax, rw[q]);
    rsum += rw[q];
    const double gf = per_ns(6.0 * static_cast<double>(rw[q] * H * I), gt[q]);  // gate, up, down: 3 x 2HI
    if (worst_gflops < 0 || gf < worst_gflops) worst_gflops = gf;
    const double w = per_ns(static_cast<double>(wb[q]), gt[q]);
    if (worst_gbs < 0 || w < worst_gbs) worst_gbs = w;
  }
  char of_peak[64] = " (no peak known for this device)";
  if (c.peak_rank > 0)
    std::snprintf(of_peak, sizeof of_peak, " = %.0f%% of %s", 100.0 * worst_gflops / c.peak_rank, c.peak_name);
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "%" PRId64 " rows/rank (min %" PRId64 ", max %" PRId64
                "), %.1f GFLOP/s on the slowest rank%s; "
                "its experts' weights read at %.1f GB/s = %.0f%% of %.0f GB/s%s%s",
                rsum / n, rmin, rmax, worst_gflops, of_peak, worst_gbs, 100.0 * worst_gbs / std::max(membw, 1e-9),
                membw, gemm_path.empty() ? "" : "; ", gemm_path.c_str());
  return buf;
}

// One rank's expert GEMMs from device offsets (time_routed_gemms).
std::string routed_detail(const Options& o, double membw, const Gathered& g, const std::string& routed_path) {
  const int64_t rows = g.field(kRows)[0], weight_bytes = g.field(kWeightBytes)[0];
  const double gf = per_ns(6.0 * static_cast<double>(rows * o.H * o.I), g.slowest(kRouted));
  const double w = per_ns(static_cast<double>(weight_bytes), g.slowest(kRouted));
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "the same GEMMs from offsets in device memory (a CUDA graph's decode step): %.1f GFLOP/s; "
                "weights read at %.1f GB/s = %.0f%% of %.0f GB/s; %s",
                gf, w, 100.0 * w / std::max(membw, 1e-9), membw, routed_path.c_str());
  return buf;
}

std::string combine_detail(const Gathered& g) {
  char buf[1024];
  if (g.n > 1) {
    const auto [mb, gbs] = rate(g, kCombineBytes, kCombine);
    std::snprintf(buf, sizeof buf, "%.2f MB/rank to peers, %.2f GB/s, weighted sum in expert order", mb, gbs);
  } else {
    std::snprintf(buf, sizeof buf, "one rank: weighted sum in expert order");
  }
  return buf;
}

std::string shared_detail(const Options& o, int64_t S, int64_t T, const Gathered& g) {
  const double gf = per_ns(6.0 * static_cast<double>(T * o.H * S), g.slowest(kShared));
  char buf[1024];
  std::snprintf(buf, sizeof buf, "%" PRId64 " rows, %.1f GFLOP/s", T, gf);
  return buf;
}

std::string captured_detail(const Options& o, const Gathered& g) {
  const double eager_us = us(g.slowest(kRoute)) + us(g.slowest(kDispatch)) + us(g.slowest(kGemm)) +
                          us(g.slowest(kWait)) + us(g.slowest(kCombine));
  int64_t over = 0;
  for (int64_t v : g.field(kOverflows)) over += v;
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "as a CUDA graph's step runs the layer (no shared expert): routing on the device, fixed blocks "
                "(--ep-graph-capacity %.0f), %.2f + %.2f MB/rank to peers (eager above: %.2f + %.2f; its route "
                "to combine %.1f us); %" PRId64 " of %d iterations x %d ranks overflowed; its graph on rank 0: %" PRId64
                " nodes",
                Model::kDefaultEpGraphCapacity, rate(g, kCapturedDispatchBytes, kCaptured).first,
                rate(g, kCapturedCombineBytes, kCaptured).first, rate(g, kDispatchBytes, kDispatch).first,
                rate(g, kCombineBytes, kCombine).first, eager_us, over, o.iters, g.n, g.field(kCapturedNodes)[0]);
  return buf;
}

std::string plans_detail(const cpu::ExchangeShape& shape) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "a captured exchange's index plans for ep %" PRId64 " on this routing (blocks of %" PRId64
                " records / %" PRId64 " rows): send plan (a thread block per peer) + recv plan (one)",
                shape.ep, shape.C, shape.Cc);
  return buf;
}

std::string wire_detail(const Options& o, double membw, const cpu::ExchangeShape& shape, const Gathered& g) {
  // Pack reads the fp32 blocks and writes the wire's bytes, unpack the reverse.
  const double fp32_bytes = 4.0 * static_cast<double>(shape.ep * shape.block_rows() * o.H);
  const double wire_bytes =
      static_cast<double>(shape.ep * wire_block_bytes(o.wire, shape.block_rows() * o.H, shape.C * o.H, o.H));
  const double gbs = per_ns(2.0 * (fp32_bytes + wire_bytes), g.slowest(kWire));
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "those dispatch blocks packed for the %s wire and read back (%.2f MB of fp32, %.2f MB on the wire): "
                "%.1f GB/s = %.0f%% of %.0f GB/s",
                expert_wire_name(o.wire), fp32_bytes / 1e6, wire_bytes / 1e6, gbs, 100.0 * gbs / std::max(membw, 1e-9),
                membw);
  return buf;
}

std::string wire_rows_detail(const Options& o, double membw, int64_t T, const Gathered& g) {
  // Each way reads one form of the rows and writes the other.
  const double P = static_cast<double>(T * o.k);
  const double fp32_bytes = 4.0 * P * static_cast<double>(o.H), wire_bytes = P * wire_row_bytes(o.wire, o.H);
  const double gbs = per_ns(2.0 * (fp32_bytes + wire_bytes), g.slowest(kWireRows));
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "an eager exchange's %.0f (token, expert) rows gathered onto the %s wire and read back as the owner "
                "gathers them (%.2f MB of fp32, %.2f MB on the wire): %.1f GB/s = %.0f%% of %.0f GB/s",
                P, expert_wire_name(o.wire), fp32_bytes / 1e6, wire_bytes / 1e6, gbs,
                100.0 * gbs / std::max(membw, 1e-9), membw);
  return buf;
}

// Rank 0: one line per phase of token count T.
void print_token_count(const Options& o, const Layer& layer, int64_t T, const Figures& fig, const Gathered& g) {
  const int n = g.n;
  const double membw = layer.ceilings.membw;
  print_line(T, "route", g, kRoute, "router GEMM + top-k, ids and weights to the host");
  print_line(T, "dispatch", g, kDispatch, dispatch_detail(g, fig.block_bytes, membw));
  print_line(T, "expert GEMMs", g, kGemm, gemm_detail(o, layer.ceilings, g, fig.gemm_path));
  if (n == 1 && g.field(kRows)[0] > 0)
    print_line(T, "routed GEMMs", g, kRouted, routed_detail(o, membw, g, fig.routed_path));
  if (n > 1) print_line(T, "(wait)", g, kWait, "barrier before the combine: the other ranks' longer expert GEMMs");
  print_line(T, "combine", g, kCombine, combine_detail(g));
  if (layer.S > 0) print_line(T, "shared expert", g, kShared, shared_detail(o, layer.S, T, g));
  print_line(T, "total", g, kTotal, "");
  if (g.slowest(kCapturedDispatchBytes) > 0) print_line(T, "captured", g, kCaptured, captured_detail(o, g));
  if (fig.plan_shape.C > 0) {
    print_line(T, "plans", g, kPlans, plans_detail(fig.plan_shape));
    if (g.slowest(kWire) > 0) print_line(T, "wire", g, kWire, wire_detail(o, membw, fig.plan_shape, g));
    if (g.slowest(kWireRows) > 0) print_line(T, "wire rows", g, kWireRows, wire_rows_detail(o, membw, T, g));
  }
  std::fflush(stdout);
}

void print_footer(const std::string& expert_path) {
  // Said after the runs: a backend may change path on its first grouped GEMM (cuBLAS refusing a type).
  // The routed experts' path, which the shared expert's GEMMs (one group) would hide.
  std::printf("# expert GEMMs ran as: %s\n", expert_path.empty() ? "(no rows)" : expert_path.c_str());
  std::printf(
      "#\n# published, for context (DeepSeek-V3 size: hidden 7168, FP8 dispatch / BF16 combine, GPUs):\n"
      "#   Perplexity, 8x H200 over NVLink, EP8, 128 tokens: dispatch ~50 us, combine ~64 us\n"
      "#   Perplexity, EP16 over EFA: dispatch ~215 us, combine ~242 us\n"
      "#   DeepEP (low-latency kernels) on ConnectX-7: dispatch ~43 us, combine ~72 us\n");
  std::fflush(stdout);
}

}  // namespace

int cmd_bench_moe(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, &o)) return 0;
  Layer layer;
  build_layer(o, &layer);
  ComputeBackend& b = *layer.backend;
  if (layer.rank == 0) print_header(o, layer);

  Scratch scratch(b);
  std::string expert_path;  // how the expert GEMMs ran (the last token count's, for the footer)
  for (int64_t T : o.tokens) {
    const LayerBuffers a = alloc_activations(o, b, layer.rank, T);
    Figures fig;
    time_eager_layer(o, layer, scratch, a, &fig);
    if (layer.n > 1 && layer.comm->can_enqueue() && T > 0) time_captured_layer(o, layer, scratch, a, &fig);
    if (T > 0 && o.plan_ep > 0 && o.E % o.plan_ep == 0) time_plans(o, layer, a, &fig);
    time_all_to_all(o, layer, &fig);
    const Gathered g = gather_fields(*layer.comm, fig);
    free_activations(b, a);
    if (layer.rank != 0) continue;
    print_token_count(o, layer, T, fig, g);
    if (!fig.gemm_path.empty()) expert_path = fig.gemm_path;
  }
  if (layer.rank == 0) print_footer(expert_path);
  b.free(layer.bias_dev);
  return 0;
}

}  // namespace shardlm
