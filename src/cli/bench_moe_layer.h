// The MoE layer shardlm bench-moe times, as one rank of its ep group holds it, and the timing of
// its phases, kept apart from the command's options and printing (cli/cmd_bench_moe.cpp) so that
// the layer reads as the MoE block runs it. The figures are this rank's; rank 0 gathers them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/expert_ffn.h"
#include "arch/expert_wire.h"
#include "arch/scratch.h"
#include "compute/backend.h"
#include "core/dtype.h"
#include "cpu/expert_exchange.h"
#include "model/model_spec.h"
#include "parallel/communicator.h"

namespace shardlm::bench_moe {

// The command's options.
struct Options {
  int64_t H = 1024, E = 64, I = 256, k = 8, groups = 8, topk_groups = 4, shared = 1;
  std::string tokens_text = "128,4096", dtype = "bf16", scoring = "sigmoid", backend_name = "cpu", comm_name = "mpi";
  std::string fp8_prefill = "w8a8", fp8_expert_gemm = "grouped", routed_gemm = "grouped", wire_name = "fp32";
  std::string grouped_gemm_core = "auto", gate_up = "stacked";
  int iters = 10, warmup = 2, threads = 0, plan_ep = 8;
  double timeout = 120, scale = 2.5;
  std::vector<int64_t> tokens;         // tokens_text, read
  ExpertWire wire = ExpertWire::kF32;  // wire_name, read
};

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
  kOverflows,      // timed iterations whose fixed blocks overflowed
  kPlans,          // median seconds (as ns) of a captured exchange's two index plans
  kWire,           // median seconds (as ns) of packing those plans' dispatch blocks for the --ep-wire and back
  kWireRows,       // median seconds (as ns) of the T x k rows gathered onto the --ep-wire and back (eager)
  kCapturedNodes,  // nodes of the captured layer's graph (0: not captured)
  kFields
};

// This machine's ceilings, measured on rank 0 and broadcast (device_text is rank 0's alone).
struct Ceilings {
  bool gpu = false;
  double peak_alone = 0, membw = 0;  // one rank's FMA or tensor peak (GFLOP/s), memory bandwidth (GB/s)
  double peak_rank = 0;              // a rank's share of the peak when all run
  const char* peak_name = "";
  std::string device_text;
};

// The layer this rank holds: its ep group, its backend with the weights (random) loaded, the
// routing, and the ceilings its figures are set beside. Members are destroyed in reverse order:
// the weights before the backend, the backend before the communicator.
struct Layer {
  std::unique_ptr<Communicator> comm;
  int n = 1, rank = 0;  // the ep group's size and this rank in it
  int hw = 1;           // the machine's hardware threads
  MoeSpec m;
  std::unique_ptr<ComputeBackend> backend;
  DType wdt = DType::F32;                   // the experts' weight type
  std::vector<std::vector<uint8_t>> store;  // host bytes behind the weights
  Matrix router;
  float* bias_dev = nullptr;  // the router's correction bias, backend memory
  RouterConfig cfg;
  int64_t L = 0;  // experts per rank
  LocalExperts experts;  // gate and up stacked per expert with --gate-up stacked, where the backend can
  int64_t S = 0;         // the shared experts' intermediate size (0: none)
  LocalExperts shared;
  Ceilings ceilings;
  int64_t weight_elem_bytes = 4;  // bytes a weight of the experts is read as
};

// The ep group, the backend and the weights of this rank, and the ceilings (collective).
void build_layer(const Options& o, Layer* layer);

// A layer's buffers in backend memory: the input, the output, the shared expert's result, the
// router's logits, ids and weights.
struct LayerBuffers {
  int64_t T = 0;  // tokens on this rank
  float* h = nullptr;
  float* out = nullptr;
  float* shared_y = nullptr;
  float* ldev = nullptr;
  int32_t* ids = nullptr;
  float* wdev = nullptr;
};

// T tokens' activations, the input random (its own on each rank).
LayerBuffers alloc_activations(const Options& o, ComputeBackend& b, int rank, int64_t T);
void free_activations(ComputeBackend& b, const LayerBuffers& a);

// What one token count measured on this rank: each Field's timed iterations (seconds) and the
// bytes and rows behind them.
struct Figures {
  std::vector<std::vector<double>> t = std::vector<std::vector<double>>(kFields);
  int64_t dbytes = 0, cbytes = 0, rows = 0, wbytes = 0;   // the eager layer's
  int64_t cap_dbytes = 0, cap_cbytes = 0, overflows = 0, cap_nodes = 0;  // the captured layer's
  cpu::ExchangeShape plan_shape;                          // the plans' exchange (C 0: not timed)
  int64_t block_bytes = 0;                                // the all-to-all ceiling's block, the largest rank's
  // How the routed and the expert GEMMs ran at this token count.
  std::string routed_path, gemm_path;
};

// The layer as the MoE block runs it eagerly, phase by phase: route (ids and weights to the
// host), dispatch, expert GEMMs, wait, combine, shared expert.
void time_eager_layer(const Options& o, const Layer& layer, Scratch& scratch, const LayerBuffers& a, Figures* fig);

// The layer as a captured decode step runs it (arch/expert_exchange.h), where the ep group can
// queue collectives on the stream (NCCL): routing kept on the device, fixed blocks (the default
// --ep-graph-capacity) over queued all-to-alls, the routed GEMMs, no host read; timed eagerly,
// from the router to the combined rows, without the shared expert.
void time_captured_layer(const Options& o, const Layer& layer, Scratch& scratch, const LayerBuffers& a, Figures* fig);

// A captured exchange's index plans alone (kernels/cuda/expert_exchange.h on the GPU), for an ep
// group of --plan-ep on this rank's routing: the send plan, then the recv plan over the send
// plan's own blocks as if each had come from another rank (the same sizes).
void time_plans(const Options& o, const Layer& layer, const LayerBuffers& a, Figures* fig);

// The all-to-all ceiling: equal blocks carrying the largest rank's dispatch bytes (collective).
void time_all_to_all(const Options& o, const Layer& layer, Figures* fig);

}  // namespace shardlm::bench_moe
