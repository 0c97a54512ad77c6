#include "cli/bench_moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>

#include "arch/expert_exchange.h"
#include "arch/model.h"
#include "arch/moe_router.h"
#include "core/error.h"
#include "cpu/ceilings.h"
#include "cpu/threads.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"
#include "parallel/gpu_binding.h"
#include "parallel/mpi_env.h"
#include "parallel/node_local.h"

namespace shardlm::bench_moe {

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
Matrix random_matrix(ComputeBackend& b, std::vector<std::vector<uint8_t>>& store, int64_t rows, int64_t cols, DType dt,
                     uint64_t seed, float scale) {
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

// The ep group over every rank of the job, and the CPU threads each rank runs.
void open_ep_group(const Options& o, Layer* layer) {
  std::vector<int> members(static_cast<size_t>(MpiEnv::size()));
  for (size_t i = 0; i < members.size(); ++i) members[i] = static_cast<int>(i);
  // One GPU per rank before the communicator: NCCL and staged MPI buffers live on it.
  if (o.backend_name == "cuda" || o.comm_name == "nccl") bind_local_gpu(node_local(o.timeout));
  layer->comm = make_communicator(o.comm_name, members, "ep", o.timeout);
  const int n = layer->comm->size();
  layer->n = n;
  layer->rank = layer->comm->rank();
  SHARDLM_CHECK(o.E % n == 0, "shardlm bench-moe: " << n << " ranks do not divide " << o.E << " experts");
  layer->hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::set_num_threads(o.threads > 0 ? o.threads : std::max(1, std::min(cpu::num_threads(), layer->hw / n)));
}

MoeSpec moe_spec(const Options& o) {
  const bool sigmoid = o.scoring == "sigmoid";
  MoeSpec m;
  m.num_experts = o.E;
  m.experts_per_token = o.k;
  m.expert_intermediate = o.I;
  m.naming = sigmoid ? MoeSpec::Naming::kDeepseek : MoeSpec::Naming::kQwen;
  m.scoring = sigmoid ? MoeSpec::Scoring::kSigmoid : MoeSpec::Scoring::kSoftmax;
  m.norm_topk_prob = true;
  m.score_correction_bias = sigmoid;
  m.n_group = sigmoid ? o.groups : 1;
  m.topk_group = sigmoid ? o.topk_groups : 1;
  m.routed_scaling_factor = sigmoid ? o.scale : 1.0;
  m.shared_intermediate = o.shared * o.I;
  return m;
}

// The routing the MoE block derives from the spec (arch/moe_block.cpp).
RouterConfig router_config(const MoeSpec& m, const float* bias_dev) {
  RouterConfig cfg;
  cfg.num_experts = m.num_experts;
  cfg.k = m.experts_per_token;
  cfg.sigmoid = m.scoring == MoeSpec::Scoring::kSigmoid;
  cfg.renormalise = m.norm_topk_prob;
  cfg.norm_topk_prob = m.norm_topk_prob;
  cfg.scale = m.routed_scaling_factor;
  cfg.n_group = m.n_group;
  cfg.topk_group = m.topk_group;
  if (cfg.sigmoid) cfg.bias = bias_dev;
  return cfg;
}

// Weights: the router (f32, as DeepSeek-V3 keeps it), the correction bias, this rank's experts
// and the shared expert (whole on every rank: tp 1).
void load_weights(const Options& o, Layer* layer) {
  ComputeBackend& b = *layer->backend;
  const int64_t H = o.H, E = o.E, I = o.I;
  std::vector<std::vector<uint8_t>>& store = layer->store;
  const float ws = 1.0f / std::sqrt(static_cast<float>(H)), ds = 1.0f / std::sqrt(static_cast<float>(I));
  layer->router = random_matrix(b, store, E, H, DType::F32, 1, 4.0f * ws);
  std::vector<float> bias(static_cast<size_t>(E));
  fill_random(bias.data(), bias.size(), 2, 0.02f);
  layer->bias_dev = static_cast<float*>(b.alloc(bias.size() * sizeof(float)));
  b.copy_to_device(layer->bias_dev, bias.data(), bias.size() * sizeof(float));
  layer->cfg = router_config(layer->m, layer->bias_dev);
  const int64_t L = E / layer->n, e0 = static_cast<int64_t>(layer->rank) * L;
  layer->L = L;
  // Gate and up one after another per expert where the backend gains by it, as the MoE block
  // places them (--gate-up apart: left where they were loaded, two routed calls).
  ComputeBackend* stack_on = o.gate_up == "stacked" ? &b : nullptr;
  std::vector<ExpertWeights> experts;
  for (int64_t e = e0; e < e0 + L; ++e) {
    ExpertWeights x;
    x.gate = random_matrix(b, store, I, H, layer->wdt, 100 + 3 * e, ws);
    x.up = random_matrix(b, store, I, H, layer->wdt, 101 + 3 * e, ws);
    x.down = random_matrix(b, store, H, I, layer->wdt, 102 + 3 * e, ds);
    experts.push_back(x);
  }
  layer->experts.assign(std::move(experts), stack_on);
  const int64_t S = layer->m.shared_intermediate;
  layer->S = S;
  if (S > 0) {
    ExpertWeights x;
    x.gate = random_matrix(b, store, S, H, layer->wdt, 10, ws);
    x.up = random_matrix(b, store, S, H, layer->wdt, 11, ws);
    x.down = random_matrix(b, store, H, S, layer->wdt, 12, 1.0f / std::sqrt(static_cast<float>(S)));
    layer->shared.assign({x}, stack_on);
  }
}

// Ceilings, measured on rank 0 alone while the others wait. CPU: the fp32 FMA peak of one rank's
// threads and the memory bandwidth; when the ranks' threads outnumber the cores, a rank's fair
// share of the FMA peak is scaled down accordingly. GPU: the device's bf16 peak and HBM
// bandwidth (each rank has its own GPU).
Ceilings measure_ceilings(Communicator& comm, ComputeBackend& b, DType wdt, int hw) {
  Ceilings c;
  const int n = comm.size();
  c.gpu = b.name() == "cuda";
  comm.barrier();
  float ceil[2] = {0, 0};
  // fp8 experts kept fp8 under W8A8 run their GEMMs of more than 16 rows on fp8 tensor cores.
  const bool fp8_tensor = c.gpu && wdt == DType::F8_E4M3 && b.takes_fp8() && b.keeps_fp8_weights() && b.fp8_w8a8();
  if (comm.rank() == 0 && c.gpu) {
    DeviceCeilings d;
    SHARDLM_CHECK(b.measure_device_ceilings(&d), "backend " << b.name() << " measures no device ceilings");
    ceil[0] = static_cast<float>(fp8_tensor ? d.fp8_gflops : d.peak_gflops);
    ceil[1] = static_cast<float>(d.bw_gbs);
    c.device_text = d.text;
  } else if (comm.rank() == 0) {
    ceil[0] = static_cast<float>(cpu::measure_fma_peak_gflops(100));
    ceil[1] = static_cast<float>(cpu::measure_memory_bandwidth(2).best());
  }
  comm.broadcast(ceil, 2, CommDType::kF32, 0);
  c.peak_alone = ceil[0];
  c.membw = ceil[1];
  c.peak_rank = c.gpu ? c.peak_alone : c.peak_alone * std::min(1.0, static_cast<double>(hw) / (n * cpu::num_threads()));
  c.peak_name = fp8_tensor ? "the fp8 tensor peak" : c.gpu ? "the bf16 tensor peak" : "its FMA peak share";
  return c;
}

// fp8 weights are read as 1 byte a weight only where the backend keeps them fp8 (the scales'
// 4 bytes per 128 x 128 block are left out).
int64_t bytes_per_weight(const ComputeBackend& b, DType wdt) {
  return wdt == DType::F8_E4M3 ? (b.takes_fp8() && b.keeps_fp8_weights() ? 1 : 2) : wdt == DType::BF16 ? 2 : 4;
}

float* alloc_floats(ComputeBackend& b, int64_t floats) {
  return static_cast<float*>(b.alloc(std::max<size_t>(floats, 1) * 4));
}

}  // namespace

void build_layer(const Options& o, Layer* layer) {
  open_ep_group(o, layer);
  layer->m = moe_spec(o);
  layer->backend = make_backend(o.backend_name);
  ComputeBackend& b = *layer->backend;
  b.set_fp8_w8a8(o.fp8_prefill == "w8a8");
  b.set_fp8_grouped_gemm(o.fp8_expert_gemm == "grouped");
  b.set_routed_grouped_gemm(o.routed_gemm == "grouped");
  b.set_grouped_gemm_wgmma(o.grouped_gemm_core == "auto");
  layer->wdt = o.dtype == "bf16" ? DType::BF16 : o.dtype == "fp8" ? DType::F8_E4M3 : DType::F32;
  load_weights(o, layer);
  layer->ceilings = measure_ceilings(*layer->comm, b, layer->wdt, layer->hw);
  layer->weight_elem_bytes = bytes_per_weight(b, layer->wdt);
}

LayerBuffers alloc_activations(const Options& o, ComputeBackend& b, int rank, int64_t T) {
  const int64_t H = o.H;
  std::vector<float> x(static_cast<size_t>(T * H));
  fill_random(x.data(), x.size(), 1000 + static_cast<uint64_t>(rank) * 7919 + static_cast<uint64_t>(T), 1.0f);
  LayerBuffers a;
  a.T = T;
  a.h = alloc_floats(b, T * H);
  a.out = alloc_floats(b, T * H);
  a.shared_y = alloc_floats(b, T * H);
  a.ldev = alloc_floats(b, T * o.E);
  a.ids = reinterpret_cast<int32_t*>(alloc_floats(b, T * o.k));
  a.wdev = alloc_floats(b, T * o.k);
  b.copy_to_device(a.h, x.data(), x.size() * sizeof(float));
  return a;
}

void free_activations(ComputeBackend& b, const LayerBuffers& a) {
  for (float* p : {a.h, a.out, a.shared_y, a.ldev, a.wdev}) b.free(p);
  b.free(a.ids);
}

namespace {

// How the experts' gate and up ran, for the paths printed.
std::string gate_up_text(const LocalExperts& experts) {
  return experts.stacked() ? "; gate and up as one weight per expert" : "; gate and up apart";
}

// The expert GEMMs of the rows `disp` gathered, from offsets in device memory. Returns seconds and
// says in *routed_path how they ran.
double time_routed_gemms(const Layer& layer, Scratch& scratch, ExpertDispatch& disp, std::string* routed_path) {
  ComputeBackend& b = *layer.backend;
  const int64_t R = disp.rows();
  const std::vector<int32_t> off32(disp.offsets().begin(), disp.offsets().end());
  int32_t* off_dev = reinterpret_cast<int32_t*>(alloc_floats(b, static_cast<int64_t>(off32.size())));
  b.copy_to_device(off_dev, off32.data(), off32.size() * sizeof(int32_t));
  b.synchronize();
  const auto t3 = Clock::now();
  run_routed_experts(scratch, layer.experts, disp.input(), R, R, off_dev, disp.output());
  b.synchronize();
  const double routed_s = since(t3);
  *routed_path = b.routed_linear_path() + gate_up_text(layer.experts);
  b.free(off_dev);
  return routed_s;
}

// Bytes of the weights of this rank's experts that had rows in the last dispatch (read once each).
int64_t weights_read(const ExpertDispatch& disp, int64_t I, int64_t H, int64_t weight_elem_bytes) {
  int64_t bytes = 0;
  for (size_t e = 0; e + 1 < disp.offsets().size(); ++e) {
    if (disp.offsets()[e + 1] > disp.offsets()[e]) bytes += 3 * I * H * weight_elem_bytes;
  }
  return bytes;
}

// The same blocks through the wire's packing (kernels/cuda/wire_bf16.h, wire_fp8.h) and back:
// memory-bound.
void time_wire(const Options& o, ComputeBackend& b, const cpu::ExchangeShape& shape, float* blocks, Figures* fig) {
  const int64_t H = o.H, len = shape.block_rows() * H, round = shape.C * H;
  const int64_t bytes = shape.ep * wire_block_bytes(o.wire, len, round, H);
  void* packed = alloc_floats(b, (bytes + 3) / 4);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    b.synchronize();
    const auto t0 = Clock::now();
    if (o.wire == ExpertWire::kFp8) {
      b.pack_fp8(blocks, shape.ep, len, round, H, static_cast<uint8_t*>(packed));
      b.unpack_fp8(static_cast<uint8_t*>(packed), shape.ep, len, round, H, blocks);
    } else {
      b.pack_bf16(blocks, shape.ep, len, round, static_cast<uint16_t*>(packed));
      b.unpack_bf16(static_cast<uint16_t*>(packed), shape.ep, len, round, blocks);
    }
    b.synchronize();
    if (it >= o.warmup) fig->t[kWire].push_back(since(t0));
  }
  b.free(packed);
}

// An eager exchange's rows through the wire as it moves them (arch/expert_wire.h): every (token,
// expert) pair's row gathered onto the wire and read back off it in order, one pass each way.
void time_wire_rows(const Options& o, ComputeBackend& b, const LayerBuffers& a, Figures* fig) {
  const int64_t H = o.H, P = a.T * o.k;
  std::vector<int32_t> pair_token(static_cast<size_t>(P)), in_order(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) {
    pair_token[i] = static_cast<int32_t>(i / o.k);
    in_order[i] = static_cast<int32_t>(i);
  }
  auto upload = [&](const std::vector<int32_t>& v) {
    auto* d = reinterpret_cast<int32_t*>(alloc_floats(b, static_cast<int64_t>(v.size())));
    b.copy_to_device(d, v.data(), v.size() * sizeof(int32_t));
    return d;
  };
  int32_t* gather = upload(pair_token);
  int32_t* order = upload(in_order);
  void* packed = alloc_floats(b, (P * wire_row_bytes(o.wire, H) + 3) / 4);
  float* rows = alloc_floats(b, P * H);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    b.synchronize();
    const auto t0 = Clock::now();
    pack_wire_rows(b, o.wire, a.h, H, gather, P, packed);
    unpack_wire_rows(b, o.wire, packed, H, order, P, rows);
    b.synchronize();
    if (it >= o.warmup) fig->t[kWireRows].push_back(since(t0));
  }
  for (int32_t* p : {gather, order}) b.free(p);
  b.free(packed);
  b.free(rows);
}

}  // namespace

void time_eager_layer(const Options& o, const Layer& layer, Scratch& scratch, const LayerBuffers& a, Figures* fig) {
  ComputeBackend& b = *layer.backend;
  Communicator& comm = *layer.comm;
  const int64_t T = a.T, H = o.H, I = o.I, k = o.k, S = layer.S;
  ExpertDispatch disp(layer.n > 1 ? layer.comm.get() : nullptr, o.E, H);
  Routing routing;
  routing.T = T;
  routing.k = k;
  routing.experts.resize(static_cast<size_t>(T * k));
  routing.weights.resize(static_cast<size_t>(T * k));
  std::vector<std::vector<double>>& t = fig->t;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    comm.barrier();
    const auto t0 = Clock::now();
    if (T > 0) {
      b.linear(a.h, T, layer.router, nullptr, a.ldev);
      b.moe_route(a.ldev, T, layer.cfg, a.ids, a.wdev);
      b.copy_to_host(routing.experts.data(), a.ids, routing.experts.size() * sizeof(int32_t));
      b.copy_to_host(routing.weights.data(), a.wdev, routing.weights.size() * sizeof(float));
    }
    const double route_s = since(t0);
    // The rows' twin where run_experts reads one, as the MoE block's eager steps gather them.
    disp.dispatch(scratch, a.h, routing, o.wire, experts_read_twins(b, layer.experts) ? INT64_MAX : 0);
    const auto t1 = Clock::now();
    run_experts(scratch, layer.experts, H, disp.input(), disp.offsets(), disp.output());
    b.synchronize();
    const double gemm_s = since(t1);
    // Before the shared expert's GEMMs (one group) change what the backend last ran.
    if (disp.rows() > 0) fig->gemm_path = b.grouped_linear_path() + gate_up_text(layer.experts);
    // Ranks finish their experts at different times (uneven rows per rank); wait here so that
    // the combine's time is its own and the imbalance shows as the wait.
    const auto tw = Clock::now();
    comm.barrier();
    const double wait_s = since(tw);
    disp.combine(scratch, a.out);
    const auto t2 = Clock::now();
    if (S > 0 && T > 0) {
      run_experts(scratch, layer.shared, H, a.h, {0, T}, a.shared_y);
      b.gated_add(a.out, a.shared_y, nullptr, T, H);
    }
    b.synchronize();
    const double shared_s = since(t2);
    const double total_s = since(t0);
    // One rank: the same expert GEMMs as a decode step captured in a CUDA graph runs them, from
    // the per-expert offsets in device memory (grouped_linear_routed), outside the total.
    double routed_s = 0;
    if (layer.n == 1 && disp.rows() > 0) routed_s = time_routed_gemms(layer, scratch, disp, &fig->routed_path);
    if (it < o.warmup) continue;
    t[kRouted].push_back(routed_s);
    t[kRoute].push_back(route_s);
    t[kDispatch].push_back(disp.dispatch_seconds);
    t[kGemm].push_back(gemm_s);
    t[kWait].push_back(wait_s);
    t[kCombine].push_back(disp.combine_seconds);
    t[kShared].push_back(shared_s);
    t[kTotal].push_back(total_s);
    fig->dbytes = disp.dispatch_bytes;
    fig->cbytes = disp.combine_bytes;
    fig->rows = disp.rows();
    fig->wbytes = weights_read(disp, I, H, layer.weight_elem_bytes);
  }
}

void time_captured_layer(const Options& o, const Layer& layer, Scratch& scratch, const LayerBuffers& a, Figures* fig) {
  ComputeBackend& b = *layer.backend;
  Communicator& comm = *layer.comm;
  const int n = layer.n;
  const int64_t T = a.T, H = o.H, E = o.E, k = o.k;
  ExpertExchange ex(layer.comm.get(), E, H);
  const cpu::ExchangeShape shape = exchange_shape(T, 1, n, E, k, H, Model::kDefaultEpGraphCapacity);
  const int64_t P = n * shape.Cc, usual = std::min(P, T * k);  // the GEMMs chosen as the MoE block does
  int32_t* flag = reinterpret_cast<int32_t*>(alloc_floats(b, 1));
  const int32_t no_overflow = 0;
  auto layer_step = [&] {
    b.linear(a.h, T, layer.router, nullptr, a.ldev);
    b.moe_route(a.ldev, T, layer.cfg, a.ids, a.wdev);
    ex.dispatch(scratch, shape, a.h, a.ids, T, cpu::RowShare{}, nullptr, nullptr, flag, o.wire);
    run_routed_experts(scratch, layer.experts, ex.input(), P, usual, ex.offsets(), ex.output());
    ex.combine(scratch, a.ids, a.wdev, a.out);
  };
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    b.copy_to_device(flag, &no_overflow, sizeof no_overflow);
    b.synchronize();
    comm.barrier();
    const auto t0 = Clock::now();
    layer_step();
    b.synchronize();
    const double captured_s = since(t0);
    int32_t overflowed = 0;
    b.copy_to_host(&overflowed, flag, sizeof overflowed);
    if (it < o.warmup) continue;
    fig->t[kCaptured].push_back(captured_s);
    fig->overflows += overflowed != 0;
  }
  fig->cap_dbytes = ex.dispatch_bytes();
  fig->cap_cbytes = ex.combine_bytes();
  // The layer captured once more (every rank at once, as a decode step's graph holds it), for the
  // nodes it takes; the timed runs above sized every buffer and table it uses.
  b.begin_capture();
  layer_step();
  fig->cap_nodes = b.captured_nodes(b.end_capture());
  b.drop_captures();
  b.free(flag);
}

void time_plans(const Options& o, const Layer& layer, const LayerBuffers& a, Figures* fig) {
  ComputeBackend& b = *layer.backend;
  const int64_t T = a.T, H = o.H, k = o.k;
  const cpu::ExchangeShape shape = exchange_shape(T, 1, o.plan_ep, o.E, k, H, Model::kDefaultEpGraphCapacity);
  auto ints = [&](int64_t count) { return reinterpret_cast<int32_t*>(alloc_floats(b, count)); };
  int32_t* rec = ints(shape.ep * shape.block_rows());
  float* blocks = alloc_floats(b, shape.ep * shape.block_rows() * H);
  int32_t* pair_row = ints(T * k);
  int32_t* offsets = ints(shape.L + 1);
  int32_t* row_src = ints(shape.ep * shape.Cc);
  int32_t* back_row = ints(shape.ep * shape.Cc);
  int32_t* flag = ints(1);
  b.linear(a.h, T, layer.router, nullptr, a.ldev);
  b.moe_route(a.ldev, T, layer.cfg, a.ids, a.wdev);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    b.synchronize();
    const auto t0 = Clock::now();
    b.expert_send_plan(shape, a.ids, T, cpu::RowShare{}, nullptr, rec, blocks, pair_row, nullptr, flag);
    b.expert_recv_plan(shape, blocks, offsets, row_src, back_row);
    b.synchronize();
    if (it >= o.warmup) fig->t[kPlans].push_back(since(t0));
  }
  if (o.wire != ExpertWire::kF32) {
    time_wire(o, b, shape, blocks, fig);
    time_wire_rows(o, b, a, fig);
  }
  for (int32_t* p : {rec, pair_row, offsets, row_src, back_row, flag}) b.free(p);
  b.free(blocks);
  fig->plan_shape = shape;
}

void time_all_to_all(const Options& o, const Layer& layer, Figures* fig) {
  Communicator& comm = *layer.comm;
  const int n = layer.n;
  int64_t block_bytes = n > 1 ? fig->dbytes / (n - 1) : 0;
  comm.all_reduce(&block_bytes, 1, CommDType::kI64, ReduceOp::kMax);
  fig->block_bytes = block_bytes;
  const size_t block = static_cast<size_t>((block_bytes + 3) / 4);
  if (n > 1 && block > 0) {
    std::vector<float> a(block * static_cast<size_t>(n), 1.0f), c(a.size());
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      comm.barrier();
      const auto t0 = Clock::now();
      comm.all_to_all(a.data(), c.data(), block, CommDType::kF32);
      if (it >= o.warmup) fig->t[kA2a].push_back(since(t0));
    }
  }
}

}  // namespace shardlm::bench_moe
