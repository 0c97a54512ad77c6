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
#include <omp.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/expert_exchange.h"
#include "arch/model.h"
#include "arch/moe_router.h"
#include "arch/scratch.h"
#include "cli/commands.h"
#include "cli/subcommand.h"
#include "compute/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cpu/ceilings.h"
#include "cpu/threads.h"
#include "cpu/wire_bf16.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"
#include "model/model_spec.h"
#include "parallel/communicator.h"
#include "parallel/gpu_binding.h"
#include "parallel/mpi_env.h"
#include "parallel/node_local.h"

namespace po = boost::program_options;

namespace shardlm {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Deterministic values in [-scale, scale).
void fill_random(float* p, size_t n, uint64_t seed, float scale) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  for (size_t i = 0; i < n; ++i) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const uint64_t z = s * 0x2545F4914F6CDD1Dull;
    p[i] = (static_cast<float>(z >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
  }
}

// A random weight [rows, cols] held in `store` and handed to the backend.
Matrix random_matrix(ComputeBackend& b, std::vector<std::vector<uint8_t>>& store, int64_t rows, int64_t cols,
                     DType dt, uint64_t seed, float scale) {
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<float> f(n);
  fill_random(f.data(), n, seed, scale);
  if (dt == DType::F8_E4M3) {
    // 128 x 128 blocks, quantised as DeepSeek-V3's checkpoints are; kept fp8 where the backend
    // computes with fp8 weights, else dequantised to bf16 on the host.
    constexpr int64_t kBlock = 128;
    const int64_t sr = (rows + kBlock - 1) / kBlock, sc = (cols + kBlock - 1) / kBlock;
    store.emplace_back(n);
    std::vector<uint8_t>& q = store.back();
    store.emplace_back(static_cast<size_t>(sr * sc) * sizeof(float));
    auto* scales = reinterpret_cast<float*>(store.back().data());
    quantize_fp8_block(f.data(), rows, cols, kBlock, kBlock, q.data(), scales);
    TensorView w, s;
    w.name = "random";
    w.dtype = DType::F8_E4M3;
    w.shape = {rows, cols};
    w.data = q.data();
    w.nbytes = n;
    s.name = "random_scale_inv";
    s.dtype = DType::F32;
    s.shape = {sr, sc};
    s.data = scales;
    s.nbytes = static_cast<size_t>(sr * sc) * sizeof(float);
    if (b.takes_fp8()) return b.load_fp8_matrix(w, s, kBlock, kBlock, 0, rows, 0, cols, /*keep=*/true);
    store.emplace_back(n * 2);
    dequant_fp8_block(w, s, kBlock, kBlock, 0, rows, 0, cols, reinterpret_cast<uint16_t*>(store.back().data()));
    w.dtype = DType::BF16;
    w.data = store.back().data();
    w.nbytes = n * 2;
    return b.load_matrix(w);
  }
  store.emplace_back(n * dtype_size(dt));
  if (dt == DType::BF16) {
    uint16_t* o = reinterpret_cast<uint16_t*>(store.back().data());
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(f[i]);
  } else {
    std::memcpy(store.back().data(), f.data(), n * sizeof(float));
  }
  TensorView v;
  v.name = "random";
  v.dtype = dt;
  v.shape = {rows, cols};
  v.data = store.back().data();
  v.nbytes = store.back().size();
  return b.load_matrix(v);
}

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

// Per-rank figures of one token count, gathered on rank 0 (integers: the communicator has no f64).
enum Field {
  kRoute,
  kDispatch,
  kGemm,
  kWait,
  kCombine,
  kShared,
  kTotal,
  kA2a,
  kRouted,  // median seconds (as ns)
  kDispatchBytes,
  kCombineBytes,
  kRows,
  kWeightBytes,  // bytes of the weights of this rank's experts that had rows (read once each)
  kCaptured,     // median seconds (as ns) of the layer as a captured step runs it
  kCapturedDispatchBytes,
  kCapturedCombineBytes,
  kOverflows,  // timed iterations whose fixed blocks overflowed
  kPlans,      // median seconds (as ns) of a captured exchange's two index plans
  kWire,       // median seconds (as ns) of packing those plans' dispatch blocks for a bf16 wire and back
  kFields
};

}  // namespace

int cmd_bench_moe(int argc, char** argv) {
  int64_t H = 1024, E = 64, I = 256, k = 8, groups = 8, topk_groups = 4, shared = 1;
  std::string tokens_text = "128,4096", dtype = "bf16", scoring = "sigmoid", backend_name = "cpu", comm_name = "mpi";
  std::string fp8_prefill = "w8a8", fp8_expert_gemm = "grouped", routed_gemm = "grouped", wire_name = "fp32";
  int iters = 10, warmup = 2, threads = 0, plan_ep = 8;
  double timeout = 120, scale = 2.5;
  po::options_description d("shardlm bench-moe options");
  d.add_options()("hidden", po::value(&H)->default_value(H), "hidden size")(
      "experts", po::value(&E)->default_value(E), "routed experts (a multiple of the rank count)")(
      "inter", po::value(&I)->default_value(I), "intermediate size of each routed expert")(
      "top-k", po::value(&k)->default_value(k), "experts per token")(
      "groups", po::value(&groups)->default_value(groups), "expert groups (sigmoid routing; 1: no group limit)")(
      "topk-groups", po::value(&topk_groups)->default_value(topk_groups), "groups kept per token")(
      "shared", po::value(&shared)->default_value(shared), "shared experts (each of --inter), 0: none")(
      "scoring", po::value(&scoring)->default_value(scoring), "sigmoid (DeepSeek-V3) or softmax (Mixtral/Qwen)")(
      "routed-scaling", po::value(&scale)->default_value(scale), "routed_scaling_factor (sigmoid routing)")(
      "tokens", po::value(&tokens_text)->default_value(tokens_text), "tokens per rank, a comma list")(
      "dtype", po::value(&dtype)->default_value(dtype),
      "expert weight type: bf16, f32 or fp8 (e4m3, 128 x 128 block scales: kept fp8 on the GPU)")(
      "iters,n", po::value(&iters)->default_value(iters), "timed iterations per token count")(
      "warmup,w", po::value(&warmup)->default_value(warmup), "untimed iterations per token count")(
      "threads", po::value(&threads)->default_value(threads), "CPU threads per rank (0: cores / ranks)")(
      "backend", po::value(&backend_name)->default_value(backend_name), "compute backend: cpu or cuda")(
      "comm", po::value(&comm_name)->default_value(comm_name), "communicator of the ep group: mpi, fabric or nccl")(
      "timeout", po::value(&timeout)->default_value(timeout), "seconds any rank waits for its peers before failing")(
      "fp8-prefill", po::value(&fp8_prefill)->default_value(fp8_prefill),
      "--dtype fp8 on --backend cuda: expert groups of more than 16 rows as W8A8 block-scaled fp8 GEMMs (w8a8) or on "
      "the weight dequantised to bf16 (bf16), as shardlm run")(
      "fp8-expert-gemm", po::value(&fp8_expert_gemm)->default_value(fp8_expert_gemm),
      "with --fp8-prefill w8a8: those groups in one grouped W8A8 launch on fp8 tensor cores (grouped) or one cuBLASLt "
      "GEMM per expert (per-expert), as shardlm run")(
      "plan-ep", po::value(&plan_ep)->default_value(plan_ep),
      "the ep group a captured exchange's index plans are timed for, on each rank's routing (any rank count; 0: "
      "skip)")(
      "routed-gemm", po::value(&routed_gemm)->default_value(routed_gemm),
      "--backend cuda, bf16 experts: the routed GEMMs (a CUDA graph's, from device offsets) of more than 16 rows an "
      "expert on average in one grouped GEMM on bf16 tensor cores (grouped) or through the direct kernel (direct)")(
      "ep-wire", po::value(&wire_name)->default_value(wire_name),
      "rows between ranks in dispatch and combine: fp32 or bf16 (half the bytes), as shardlm run --ep-wire");
  po::variables_map vm;
  if (!parse_subcommand(argc, argv, "bench-moe",
                        "mpirun -np EP shardlm bench-moe [--hidden 1024] [--experts 64] [--inter 256] [--top-k 8] "
                        "[--tokens 128,4096]",
                        d, &vm))
    return 0;
  const std::vector<int64_t> tokens = parse_tokens(tokens_text);
  SHARDLM_CHECK(dtype == "bf16" || dtype == "f32" || dtype == "fp8",
                "shardlm bench-moe: --dtype must be bf16, f32 or fp8, not '" << dtype << "'");
  SHARDLM_CHECK(fp8_prefill == "w8a8" || fp8_prefill == "bf16",
                "shardlm bench-moe: --fp8-prefill must be w8a8 or bf16, not '" << fp8_prefill << "'");
  SHARDLM_CHECK(fp8_expert_gemm == "grouped" || fp8_expert_gemm == "per-expert",
                "shardlm bench-moe: --fp8-expert-gemm must be grouped or per-expert, not '" << fp8_expert_gemm << "'");
  SHARDLM_CHECK(routed_gemm == "grouped" || routed_gemm == "direct",
                "shardlm bench-moe: --routed-gemm must be grouped or direct, not '" << routed_gemm << "'");
  const ExpertWire wire = parse_expert_wire(wire_name);
  SHARDLM_CHECK(scoring == "sigmoid" || scoring == "softmax",
                "shardlm bench-moe: --scoring must be sigmoid or softmax, not '" << scoring << "'");
  SHARDLM_CHECK(H > 0 && E > 0 && I > 0 && k > 0 && k <= E && shared >= 0,
                "shardlm bench-moe: sizes must be positive and --top-k at most --experts");
  SHARDLM_CHECK(iters >= 1 && warmup >= 0, "shardlm bench-moe: --iters must be >= 1 and --warmup >= 0");

  std::vector<int> members(static_cast<size_t>(MpiEnv::size()));
  for (size_t i = 0; i < members.size(); ++i) members[i] = static_cast<int>(i);
  // One GPU per rank before the communicator: NCCL and staged MPI buffers live on it.
  if (backend_name == "cuda" || comm_name == "nccl") bind_local_gpu(node_local());
  std::unique_ptr<Communicator> comm = make_communicator(comm_name, members, "ep", timeout);
  const int n = comm->size(), rank = comm->rank();
  SHARDLM_CHECK(E % n == 0, "shardlm bench-moe: " << n << " ranks do not divide " << E << " experts");
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::set_num_threads(threads > 0 ? threads : std::max(1, std::min(cpu::num_threads(), hw / n)));

  MoeSpec m;
  m.num_experts = E;
  m.experts_per_token = k;
  m.expert_intermediate = I;
  m.naming = scoring == "sigmoid" ? MoeSpec::Naming::kDeepseek : MoeSpec::Naming::kQwen;
  m.scoring = scoring == "sigmoid" ? MoeSpec::Scoring::kSigmoid : MoeSpec::Scoring::kSoftmax;
  m.norm_topk_prob = true;
  m.score_correction_bias = scoring == "sigmoid";
  m.n_group = scoring == "sigmoid" ? groups : 1;
  m.topk_group = scoring == "sigmoid" ? topk_groups : 1;
  m.routed_scaling_factor = scoring == "sigmoid" ? scale : 1.0;
  m.shared_intermediate = shared * I;

  // Weights: the router (f32, as DeepSeek-V3 keeps it), the correction bias, this rank's experts
  // and the shared expert (whole on every rank: tp 1).
  auto backend = make_backend(backend_name);
  backend->set_fp8_w8a8(fp8_prefill == "w8a8");
  backend->set_fp8_grouped_gemm(fp8_expert_gemm == "grouped");
  backend->set_routed_grouped_gemm(routed_gemm == "grouped");
  ComputeBackend& b = *backend;
  const DType wdt = dtype == "bf16" ? DType::BF16 : dtype == "fp8" ? DType::F8_E4M3 : DType::F32;
  std::vector<std::vector<uint8_t>> store;
  const float ws = 1.0f / std::sqrt(static_cast<float>(H)), ds = 1.0f / std::sqrt(static_cast<float>(I));
  const Matrix router = random_matrix(b, store, E, H, DType::F32, 1, 4.0f * ws);
  std::vector<float> bias(static_cast<size_t>(E));
  fill_random(bias.data(), bias.size(), 2, 0.02f);
  float* bias_dev = static_cast<float*>(b.alloc(bias.size() * sizeof(float)));
  b.copy_to_device(bias_dev, bias.data(), bias.size() * sizeof(float));
  // The routing the MoE block derives from the spec (arch/moe_block.cpp).
  RouterConfig cfg;
  cfg.num_experts = E;
  cfg.k = k;
  cfg.sigmoid = m.scoring == MoeSpec::Scoring::kSigmoid;
  cfg.renormalise = m.norm_topk_prob;
  cfg.norm_topk_prob = m.norm_topk_prob;
  cfg.scale = m.routed_scaling_factor;
  cfg.n_group = m.n_group;
  cfg.topk_group = m.topk_group;
  if (cfg.sigmoid) cfg.bias = bias_dev;
  const int64_t L = E / n, e0 = static_cast<int64_t>(rank) * L;
  std::vector<ExpertWeights> experts;
  experts.reserve(static_cast<size_t>(L));  // gate_w etc. point into it
  for (int64_t e = e0; e < e0 + L; ++e) {
    ExpertWeights x;
    x.gate = random_matrix(b, store, I, H, wdt, 100 + 3 * e, ws);
    x.up = random_matrix(b, store, I, H, wdt, 101 + 3 * e, ws);
    x.down = random_matrix(b, store, H, I, wdt, 102 + 3 * e, ds);
    experts.push_back(x);
  }
  std::vector<const Matrix*> gate_w, up_w, down_w;  // the routed GEMMs' weight lists
  for (const ExpertWeights& x : experts) {
    gate_w.push_back(&x.gate);
    up_w.push_back(&x.up);
    down_w.push_back(&x.down);
  }
  const int64_t S = m.shared_intermediate;
  std::vector<ExpertWeights> shared_w;
  if (S > 0) {
    ExpertWeights x;
    x.gate = random_matrix(b, store, S, H, wdt, 10, ws);
    x.up = random_matrix(b, store, S, H, wdt, 11, ws);
    x.down = random_matrix(b, store, H, S, wdt, 12, 1.0f / std::sqrt(static_cast<float>(S)));
    shared_w.push_back(x);
  }

  // Ceilings, measured on rank 0 alone while the others wait. CPU: the fp32 FMA peak of one rank's
  // threads and the memory bandwidth; when the ranks' threads outnumber the cores, a rank's fair
  // share of the FMA peak is scaled down accordingly. GPU: the device's bf16 peak and HBM
  // bandwidth (each rank has its own GPU).
  const bool gpu = b.name() == "cuda";
  comm->barrier();
  float ceil[2] = {0, 0};
  std::string device_text;
  // fp8 experts kept fp8 under W8A8 run their GEMMs of more than 16 rows on fp8 tensor cores.
  const bool fp8_tensor = gpu && wdt == DType::F8_E4M3 && b.takes_fp8() && b.keeps_fp8_weights() && b.fp8_w8a8();
  if (rank == 0 && gpu) {
    DeviceCeilings c;
    SHARDLM_CHECK(b.measure_device_ceilings(&c), "backend " << b.name() << " measures no device ceilings");
    ceil[0] = static_cast<float>(fp8_tensor ? c.fp8_gflops : c.peak_gflops);
    ceil[1] = static_cast<float>(c.bw_gbs);
    device_text = c.text;
  } else if (rank == 0) {
    ceil[0] = static_cast<float>(cpu::measure_fma_peak_gflops(100));
    ceil[1] = static_cast<float>(cpu::measure_memory_bandwidth(2).best());
  }
  comm->broadcast(ceil, 2, CommDType::kF32, 0);
  const double peak_alone = ceil[0], membw = ceil[1];
  const double peak_rank =
      gpu ? peak_alone : peak_alone * std::min(1.0, static_cast<double>(hw) / (n * cpu::num_threads()));
  const char* peak_name = fp8_tensor ? "the fp8 tensor peak" : gpu ? "the bf16 tensor peak" : "its FMA peak share";
  // fp8 weights are read as 1 byte a weight only where the backend keeps them fp8 (the scales'
  // 4 bytes per 128 x 128 block are left out).
  const int64_t weight_elem_bytes = wdt == DType::F8_E4M3 ? (b.takes_fp8() && b.keeps_fp8_weights() ? 1 : 2)
                                    : wdt == DType::BF16  ? 2
                                                          : 4;

  if (rank == 0) {
    std::printf("# shardlm bench-moe: %d rank%s (ep %d, %" PRId64 " experts per rank), %d threads per rank, "
                "%s backend\n",
                n, n == 1 ? "" : "s", n, L, cpu::num_threads(), b.name().c_str());
    std::printf("# MPI library: %s\n", MpiEnv::library_version().c_str());
    std::printf("# ep group on %s%s%s\n", comm_name.c_str(), comm->transport().empty() ? "" : ": ",
                comm->transport().c_str());
    std::printf("# layer: hidden %" PRId64 ", %" PRId64 " routed experts x intermediate %" PRId64 " (%s), top-%" PRId64
                ", %s routing", H, E, I, dtype.c_str(), k, scoring.c_str());
    if (m.scoring == MoeSpec::Scoring::kSigmoid)
      std::printf(" (%" PRId64 " groups, best %" PRId64 " kept, bias, scaling %.2f)", m.n_group, m.topk_group, scale);
    std::printf(", %" PRId64 " shared expert%s (intermediate %" PRId64 ")\n", shared, shared == 1 ? "" : "s", S);
    std::printf("# activations %s on the wire (--ep-wire): dispatch one row (%" PRId64
                " B + slots) per (token, destination rank), combine one row per (token, expert)\n",
                expert_wire_name(wire), wire_block_bytes(wire, H, H));
    if (gpu) {
      std::printf("# ceilings: %s\n", device_text.c_str());
    } else {
      std::printf("# ceilings: %d cores; fp32 FMA peak %.1f GFLOP/s for one rank's threads alone, %.1f GFLOP/s per "
                  "rank when all run (cores shared); memory bandwidth %.1f GB/s\n", hw, peak_alone, peak_rank, membw);
    }
    std::printf("# times: median over %d iterations on each rank, the slowest rank shown (fastest in brackets)\n#\n",
                iters);
    std::printf("# %9s  %-13s %11s %11s  %s\n", "tok/rank", "phase", "median(us)", "[fastest]", "detail");
  }

  Scratch scratch(b);
  std::string expert_path;  // how the expert GEMMs ran (the last token count's, for the footer)
  for (int64_t T : tokens) {
    std::string routed_path, gemm_path;  // how the routed and the expert GEMMs ran at this token count
    std::vector<float> x(static_cast<size_t>(T * H));
    fill_random(x.data(), x.size(), 1000 + static_cast<uint64_t>(rank) * 7919 + static_cast<uint64_t>(T), 1.0f);
    // Activations in backend memory: the input, the output, the shared expert's result, the
    // router's logits, ids and weights.
    auto dev = [&](int64_t floats) { return static_cast<float*>(b.alloc(std::max<size_t>(floats, 1) * 4)); };
    float* h = dev(T * H);
    float* out = dev(T * H);
    float* shared_y = dev(T * H);
    float* ldev = dev(T * E);
    int32_t* ids = reinterpret_cast<int32_t*>(dev(T * k));
    float* wdev = dev(T * k);
    b.copy_to_device(h, x.data(), x.size() * sizeof(float));
    ExpertDispatch disp(n > 1 ? comm.get() : nullptr, E, H);
    Routing routing;
    routing.T = T;
    routing.k = k;
    routing.experts.resize(static_cast<size_t>(T * k));
    routing.weights.resize(static_cast<size_t>(T * k));
    std::vector<std::vector<double>> t(kFields);
    int64_t dbytes = 0, cbytes = 0, rows = 0, wbytes = 0;
    for (int it = 0; it < warmup + iters; ++it) {
      comm->barrier();
      const auto t0 = Clock::now();
      if (T > 0) {
        b.linear(h, T, router, nullptr, ldev);
        b.moe_route(ldev, T, cfg, ids, wdev);
        b.copy_to_host(routing.experts.data(), ids, routing.experts.size() * sizeof(int32_t));
        b.copy_to_host(routing.weights.data(), wdev, routing.weights.size() * sizeof(float));
      }
      const double route_s = since(t0);
      disp.dispatch(scratch, h, routing, wire);
      const auto t1 = Clock::now();
      run_experts(scratch, experts, I, H, disp.input(), disp.offsets(), disp.output());
      b.synchronize();
      const double gemm_s = since(t1);
      // Before the shared expert's GEMMs (one group) change what the backend last ran.
      if (disp.rows() > 0) gemm_path = b.grouped_linear_path();
      // Ranks finish their experts at different times (uneven rows per rank); wait here so that
      // the combine's time is its own and the imbalance shows as the wait.
      const auto tw = Clock::now();
      comm->barrier();
      const double wait_s = since(tw);
      disp.combine(scratch, out);
      const auto t2 = Clock::now();
      if (S > 0 && T > 0) {
        run_experts(scratch, shared_w, S, H, h, {0, T}, shared_y);
        b.gated_add(out, shared_y, nullptr, T, H);
      }
      b.synchronize();
      const double shared_s = since(t2);
      const double total_s = since(t0);
      // One rank: the same expert GEMMs as a decode step captured in a CUDA graph runs them, from
      // the per-expert offsets in device memory (grouped_linear_routed), outside the total.
      double routed_s = 0;
      if (n == 1 && disp.rows() > 0) {
        const int64_t R = disp.rows();
        const std::vector<int32_t> off32(disp.offsets().begin(), disp.offsets().end());
        int32_t* off_dev = reinterpret_cast<int32_t*>(dev(static_cast<int64_t>(off32.size())));
        b.copy_to_device(off_dev, off32.data(), off32.size() * sizeof(int32_t));
        float* gate = dev(R * I);
        float* upv = dev(R * I);
        b.synchronize();
        const auto t3 = Clock::now();
        b.grouped_linear_routed(disp.input(), R, off_dev, gate_w, gate);
        b.grouped_linear_routed(disp.input(), R, off_dev, up_w, upv);
        b.silu_mul(gate, upv, gate, R * I);
        b.grouped_linear_routed(gate, R, off_dev, down_w, disp.output());
        b.synchronize();
        routed_s = since(t3);
        routed_path = b.routed_linear_path();
        for (float* p : {gate, upv}) b.free(p);
        b.free(off_dev);
      }
      if (it < warmup) continue;
      t[kRouted].push_back(routed_s);
      t[kRoute].push_back(route_s);
      t[kDispatch].push_back(disp.dispatch_seconds);
      t[kGemm].push_back(gemm_s);
      t[kWait].push_back(wait_s);
      t[kCombine].push_back(disp.combine_seconds);
      t[kShared].push_back(shared_s);
      t[kTotal].push_back(total_s);
      dbytes = disp.dispatch_bytes;
      cbytes = disp.combine_bytes;
      rows = disp.rows();
      wbytes = 0;
      for (size_t e = 0; e + 1 < disp.offsets().size(); ++e) {
        if (disp.offsets()[e + 1] > disp.offsets()[e]) wbytes += 3 * I * H * weight_elem_bytes;
      }
    }

    // The layer as a captured decode step runs it (arch/expert_exchange.h), where the ep group can
    // queue collectives on the stream (NCCL): routing kept on the device, fixed blocks (the default
    // --ep-graph-capacity) over queued all-to-alls, the routed GEMMs, no host read; timed eagerly,
    // from the router to the combined rows, without the shared expert.
    int64_t cap_dbytes = 0, cap_cbytes = 0, overflows = 0;
    cpu::ExchangeShape plan_shape;
    if (n > 1 && comm->can_enqueue() && T > 0) {
      ExpertExchange ex(comm.get(), E, H);
      const cpu::ExchangeShape shape = exchange_shape(T, 1, n, E, k, H, Model::kDefaultEpGraphCapacity);
      const int64_t P = n * shape.Cc, usual = std::min(P, T * k);  // the GEMMs chosen as the MoE block does
      int32_t* flag = reinterpret_cast<int32_t*>(dev(1));
      float* gate = dev(P * I);
      float* upv = dev(P * I);
      const int32_t no_overflow = 0;
      for (int it = 0; it < warmup + iters; ++it) {
        b.copy_to_device(flag, &no_overflow, sizeof no_overflow);
        b.synchronize();
        comm->barrier();
        const auto t0 = Clock::now();
        b.linear(h, T, router, nullptr, ldev);
        b.moe_route(ldev, T, cfg, ids, wdev);
        ex.dispatch(scratch, shape, h, ids, T, cpu::RowShare{}, nullptr, nullptr, flag, wire);
        b.grouped_linear_routed(ex.input(), P, usual, ex.offsets(), gate_w, gate);
        b.grouped_linear_routed(ex.input(), P, usual, ex.offsets(), up_w, upv);
        b.silu_mul(gate, upv, gate, P * I);
        b.grouped_linear_routed(gate, P, usual, ex.offsets(), down_w, ex.output());
        ex.combine(scratch, ids, wdev, out);
        b.synchronize();
        const double captured_s = since(t0);
        int32_t overflowed = 0;
        b.copy_to_host(&overflowed, flag, sizeof overflowed);
        if (it < warmup) continue;
        t[kCaptured].push_back(captured_s);
        overflows += overflowed != 0;
      }
      cap_dbytes = ex.dispatch_bytes();
      cap_cbytes = ex.combine_bytes();
      for (float* p : {gate, upv}) b.free(p);
      b.free(flag);
    }

    // A captured exchange's index plans alone (kernels/cuda/expert_exchange.h on the GPU), for an ep
    // group of --plan-ep on this rank's routing: the send plan, then the recv plan over the send
    // plan's own blocks as if each had come from another rank (the same sizes).
    if (T > 0 && plan_ep > 0 && E % plan_ep == 0) {
      const cpu::ExchangeShape shape = exchange_shape(T, 1, plan_ep, E, k, H, Model::kDefaultEpGraphCapacity);
      auto ints = [&](int64_t count) { return reinterpret_cast<int32_t*>(dev(count)); };
      int32_t* rec = ints(shape.ep * shape.block_rows());
      float* blocks = dev(shape.ep * shape.block_rows() * H);
      int32_t* pair_row = ints(T * k);
      int32_t* offsets = ints(shape.L + 1);
      int32_t* row_src = ints(shape.ep * shape.Cc);
      int32_t* back_row = ints(shape.ep * shape.Cc);
      int32_t* flag = ints(1);
      b.linear(h, T, router, nullptr, ldev);
      b.moe_route(ldev, T, cfg, ids, wdev);
      for (int it = 0; it < warmup + iters; ++it) {
        b.synchronize();
        const auto t0 = Clock::now();
        b.expert_send_plan(shape, ids, T, cpu::RowShare{}, nullptr, rec, blocks, pair_row, nullptr, flag);
        b.expert_recv_plan(shape, blocks, offsets, row_src, back_row);
        b.synchronize();
        if (it >= warmup) t[kPlans].push_back(since(t0));
      }
      if (wire == ExpertWire::kBf16) {
        // The same blocks through the wire's packing (kernels/cuda/wire_bf16.h) and back: memory-bound.
        const int64_t len = shape.block_rows() * H, wire_len = cpu::wire_bf16_len(len, shape.C * H);
        uint16_t* packed = reinterpret_cast<uint16_t*>(dev((shape.ep * wire_len + 1) / 2));
        for (int it = 0; it < warmup + iters; ++it) {
          b.synchronize();
          const auto t0 = Clock::now();
          b.pack_bf16(blocks, shape.ep, len, shape.C * H, packed);
          b.unpack_bf16(packed, shape.ep, len, shape.C * H, blocks);
          b.synchronize();
          if (it >= warmup) t[kWire].push_back(since(t0));
        }
        b.free(packed);
      }
      for (int32_t* p : {rec, pair_row, offsets, row_src, back_row, flag}) b.free(p);
      b.free(blocks);
      plan_shape = shape;
    }

    // The all-to-all ceiling: equal blocks carrying the largest rank's dispatch bytes.
    int64_t block_bytes = n > 1 ? dbytes / (n - 1) : 0;
    comm->all_reduce(&block_bytes, 1, CommDType::kI64, ReduceOp::kMax);
    const size_t block = static_cast<size_t>((block_bytes + 3) / 4);
    if (n > 1 && block > 0) {
      std::vector<float> a(block * static_cast<size_t>(n), 1.0f), c(a.size());
      for (int it = 0; it < warmup + iters; ++it) {
        comm->barrier();
        const auto t0 = Clock::now();
        comm->all_to_all(a.data(), c.data(), block, CommDType::kF32);
        if (it >= warmup) t[kA2a].push_back(since(t0));
      }
    }

    std::vector<int64_t> mine(kFields, 0), all(static_cast<size_t>(kFields * n));
    for (int f = kRoute; f <= kRouted; ++f) mine[f] = static_cast<int64_t>(median(t[f]) * 1e9);
    mine[kDispatchBytes] = dbytes;
    mine[kCombineBytes] = cbytes;
    mine[kRows] = rows;
    mine[kWeightBytes] = wbytes;
    mine[kCaptured] = t[kCaptured].empty() ? 0 : static_cast<int64_t>(median(t[kCaptured]) * 1e9);
    mine[kCapturedDispatchBytes] = cap_dbytes;
    mine[kCapturedCombineBytes] = cap_cbytes;
    mine[kOverflows] = overflows;
    mine[kPlans] = t[kPlans].empty() ? 0 : static_cast<int64_t>(median(t[kPlans]) * 1e9);
    mine[kWire] = t[kWire].empty() ? 0 : static_cast<int64_t>(median(t[kWire]) * 1e9);
    comm->all_gather(mine.data(), all.data(), kFields, CommDType::kI64);
    for (float* p : {h, out, shared_y, ldev, wdev}) b.free(p);
    b.free(ids);
    if (rank != 0) continue;

    auto field = [&](int f) {
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) v[q] = all[static_cast<size_t>(q * kFields + f)];
      return v;
    };
    auto us = [](int64_t ns) { return static_cast<double>(ns) / 1e3; };
    auto slowest = [&](int f) { auto v = field(f); return *std::max_element(v.begin(), v.end()); };
    auto fastest = [&](int f) { auto v = field(f); return *std::min_element(v.begin(), v.end()); };
    auto line = [&](const char* phase, int f, const std::string& detail) {
      std::printf("  %9" PRId64 "  %-13s %11.1f %11.1f  %s\n", T, phase, us(slowest(f)), us(fastest(f)),
                  detail.c_str());
    };
    auto per_ns = [](double amount, int64_t ns) { return ns > 0 ? amount / static_cast<double>(ns) : 0.0; };
    char buf[1024];
    line("route", kRoute, "router GEMM + top-k, ids and weights to the host");
    // Dispatch / combine: mean bytes a rank sends to its peers; the slowest rank's rate.
    auto rate = [&](int bytes_field, int time_field) {
      const auto bytes = field(bytes_field), ns = field(time_field);
      double worst = -1, sum = 0;
      for (int q = 0; q < n; ++q) {
        sum += static_cast<double>(bytes[q]);
        const double r = per_ns(static_cast<double>(bytes[q]), ns[q]);
        if (worst < 0 || r < worst) worst = r;
      }
      return std::make_pair(sum / n / 1e6, worst);
    };
    if (n > 1) {
      const auto [mb, gbs] = rate(kDispatchBytes, kDispatch);
      const double a2a_gbs = per_ns(static_cast<double>(block_bytes) * (n - 1), slowest(kA2a));
      std::snprintf(buf, sizeof buf,
                    "%.2f MB/rank to peers, %.2f GB/s (all_to_all of the same bytes: %.1f us, %.2f GB/s; "
                    "memory %.1f GB/s)",
                    mb, gbs, us(slowest(kA2a)), a2a_gbs, membw);
    } else {
      std::snprintf(buf, sizeof buf, "one rank: rows gathered per expert in memory, nothing sent");
    }
    line("dispatch", kDispatch, buf);
    // Few rows per expert (decode) are bound by reading the experts' weights, many by the FMA peak:
    // both rates, on the slowest rank.
    const auto rw = field(kRows), gt = field(kGemm), wb = field(kWeightBytes);
    int64_t rmin = rw[0], rmax = rw[0], rsum = 0;
    double worst_gflops = -1, worst_gbs = -1;
    for (int q = 0; q < n; ++q) {
      rmin = std::min(rmin, rw[q]);
      rmax = std::max(rmax, rw[q]);
      rsum += rw[q];
      const double g = per_ns(6.0 * static_cast<double>(rw[q] * H * I), gt[q]);  // gate, up, down: 3 x 2HI
      if (worst_gflops < 0 || g < worst_gflops) worst_gflops = g;
      const double w = per_ns(static_cast<double>(wb[q]), gt[q]);
      if (worst_gbs < 0 || w < worst_gbs) worst_gbs = w;
    }
    char of_peak[64] = " (no peak known for this device)";
    if (peak_rank > 0)
      std::snprintf(of_peak, sizeof of_peak, " = %.0f%% of %s", 100.0 * worst_gflops / peak_rank, peak_name);
    std::snprintf(buf, sizeof buf,
                  "%" PRId64 " rows/rank (min %" PRId64 ", max %" PRId64
                  "), %.1f GFLOP/s on the slowest rank%s; "
                  "its experts' weights read at %.1f GB/s = %.0f%% of %.0f GB/s%s%s",
                  rsum / n, rmin, rmax, worst_gflops, of_peak, worst_gbs, 100.0 * worst_gbs / std::max(membw, 1e-9),
                  membw, gemm_path.empty() ? "" : "; ", gemm_path.c_str());
    line("expert GEMMs", kGemm, buf);
    if (!gemm_path.empty()) expert_path = gemm_path;
    if (n == 1 && rw[0] > 0) {
      const double g = per_ns(6.0 * static_cast<double>(rw[0] * H * I), slowest(kRouted));
      const double w = per_ns(static_cast<double>(wb[0]), slowest(kRouted));
      std::snprintf(buf, sizeof buf,
                    "the same GEMMs from offsets in device memory (a CUDA graph's decode step): %.1f GFLOP/s; "
                    "weights read at %.1f GB/s = %.0f%% of %.0f GB/s; %s",
                    g, w, 100.0 * w / std::max(membw, 1e-9), membw, routed_path.c_str());
      line("routed GEMMs", kRouted, buf);
    }
    if (n > 1) line("(wait)", kWait, "barrier before the combine: the other ranks' longer expert GEMMs");
    if (n > 1) {
      const auto [mb, gbs] = rate(kCombineBytes, kCombine);
      std::snprintf(buf, sizeof buf, "%.2f MB/rank to peers, %.2f GB/s, weighted sum in expert order", mb, gbs);
    } else {
      std::snprintf(buf, sizeof buf, "one rank: weighted sum in expert order");
    }
    line("combine", kCombine, buf);
    if (S > 0) {
      const double gf = per_ns(6.0 * static_cast<double>(T * H * S), slowest(kShared));
      std::snprintf(buf, sizeof buf, "%" PRId64 " rows, %.1f GFLOP/s", T, gf);
      line("shared expert", kShared, buf);
    }
    line("total", kTotal, "");
    if (slowest(kCapturedDispatchBytes) > 0) {
      const double eager_us = us(slowest(kRoute)) + us(slowest(kDispatch)) + us(slowest(kGemm)) + us(slowest(kWait)) +
                              us(slowest(kCombine));
      int64_t over = 0;
      for (int64_t v : field(kOverflows)) over += v;
      std::snprintf(buf, sizeof buf,
                    "as a CUDA graph's step runs the layer (no shared expert): routing on the device, fixed blocks "
                    "(--ep-graph-capacity %.0f), %.2f + %.2f MB/rank to peers (eager above: %.2f + %.2f; its route "
                    "to combine %.1f us); %" PRId64 " of %d iterations x %d ranks overflowed",
                    Model::kDefaultEpGraphCapacity, rate(kCapturedDispatchBytes, kCaptured).first,
                    rate(kCapturedCombineBytes, kCaptured).first, rate(kDispatchBytes, kDispatch).first,
                    rate(kCombineBytes, kCombine).first, eager_us, over, iters, n);
      line("captured", kCaptured, buf);
    }
    if (plan_shape.C > 0) {
      std::snprintf(buf, sizeof buf,
                    "a captured exchange's index plans for ep %" PRId64 " on this routing (blocks of %" PRId64
                    " records / %" PRId64 " rows): send plan (a thread block per peer) + recv plan (one)",
                    plan_shape.ep, plan_shape.C, plan_shape.Cc);
      line("plans", kPlans, buf);
      if (slowest(kWire) > 0) {
        // Pack reads 4 and writes 2 bytes a value, unpack the reverse.
        const double values = static_cast<double>(plan_shape.ep * plan_shape.block_rows() * H);
        const double gbs = per_ns(12.0 * values, slowest(kWire));
        std::snprintf(buf, sizeof buf,
                      "those dispatch blocks packed for the bf16 wire and widened back (%.2f MB of fp32): %.1f GB/s "
                      "= %.0f%% of %.0f GB/s",
                      4.0 * values / 1e6, gbs, 100.0 * gbs / std::max(membw, 1e-9), membw);
        line("wire", kWire, buf);
      }
    }
    std::fflush(stdout);
  }
  if (rank == 0) {
    // Said after the runs: a backend may change path on its first grouped GEMM (cuBLAS refusing a type).
    // The routed experts' path, which the shared expert's GEMMs (one group) would hide.
    std::printf("# expert GEMMs ran as: %s\n", expert_path.empty() ? "(no rows)" : expert_path.c_str());
    std::printf("#\n# published, for context (DeepSeek-V3 size: hidden 7168, FP8 dispatch / BF16 combine, GPUs):\n"
                "#   Perplexity, 8x H200 over NVLink, EP8, 128 tokens: dispatch ~50 us, combine ~64 us\n"
                "#   Perplexity, EP16 over EFA: dispatch ~215 us, combine ~242 us\n"
                "#   DeepEP (low-latency kernels) on ConnectX-7: dispatch ~43 us, combine ~72 us\n");
    std::fflush(stdout);
  }
  b.free(bias_dev);
  return 0;
}

}  // namespace shardlm
