// Mixture-of-Experts feed-forward (Mixtral, Qwen2/3-MoE, DeepSeek-V3 / Kimi K2): a router picks
// k of E SwiGLU experts per token (arch/moe_router.h), the chosen experts' outputs are summed with
// the routing weights, and shared experts (DeepSeek; Qwen2-MoE with its sigmoid gate) are added.
//
// Sharding (ShardPlan::set_expert_parallel):
//   ep_size 1  every rank holds every routed expert, each sliced over tp on its intermediate
//              dimension like the dense MLP (gate/up rows, down columns); every tp rank runs all T
//              tokens and its output is a partial sum. No communication.
//   ep_size>1  each rank holds whole experts [expert0, expert0 + experts). The tp ranks of a dp
//              group hold the same T tokens, so tp rank i routes only its contiguous share
//              [T*i/tp, T*(i+1)/tp); the share's rows travel to their experts' owners over the ep
//              group (arch/expert_dispatch.h) and come back combined; rows outside the share are
//              zero in this rank's output, and the decoder's tp sum assembles the whole.
// Shared experts are tp-sliced on all T tokens either way and added (a partial sum over tp; the
// Qwen2 gate sigmoid(g(h)) is a scalar per token computed from the full h on every rank, so the
// gated partials still sum to the gated whole).
//
// Two paths, the same arithmetic, both on backend ops (on the CUDA backend the activations stay
// on the device):
//   ep_size 1  router linear, moe_route, expert_permute, expert_gather, each expert's GEMMs on its
//              contiguous rows, expert_combine. The one host read is the permute's offsets
//              [E + 1], which size each expert's GEMMs (and give the per-expert token counts of
//              the statistics). In a captured step (CUDA graphs) not even that: the expert GEMMs
//              read the offsets on the device (grouped_linear_routed) and the counts are added up
//              there (StepContext::expert_tokens).
//   ep_size>1  router linear and moe_route on the share; its ids and weights ([T, k], small) come
//              to the host, where expert_dispatch.h builds the index maps of the exchange; the
//              rows travel in backend memory (NCCL on device buffers with --comm nccl) and are
//              moved by gather_rows / combine_rows. In a captured step the index maps are built
//              on the device and the exchange has fixed sizes (expert_exchange.h).
// The shared expert goes through gated_add either way. Both sum the routed results in ascending
// expert order from unsummed per-(token, expert) rows with the same rounding and route with the
// same op, so on the CPU backend the two paths agree bit for bit and the output is bit-identical
// across expert-parallel layouts (see expert_dispatch.h).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/expert_exchange.h"
#include "arch/expert_ffn.h"
#include "arch/layer_blocks.h"
#include "arch/moe_router.h"
#include "arch/weight_loader.h"
#include "compute/backend.h"
#include "compute/op_profile.h"
#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

// Tensor names of one layer's MoE under the checkpoint's naming.
struct MoeNames {
  std::string router, bias, shared_gate;
  std::string expert_prefix, gate, up, down;  // expert_prefix + E + gate
  std::string shared_prefix;                  // shared_prefix + {gate,up,down}_proj.weight

  MoeNames(const MoeSpec& m, int64_t layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    switch (m.naming) {
      case MoeSpec::Naming::kMixtral:
        router = p + "block_sparse_moe.gate.weight";
        expert_prefix = p + "block_sparse_moe.experts.";
        gate = ".w1.weight";
        up = ".w3.weight";
        down = ".w2.weight";
        break;
      case MoeSpec::Naming::kQwen:
        router = p + "mlp.gate.weight";
        expert_prefix = p + "mlp.experts.";
        gate = ".gate_proj.weight";
        up = ".up_proj.weight";
        down = ".down_proj.weight";
        shared_prefix = p + "mlp.shared_expert.";
        shared_gate = p + "mlp.shared_expert_gate.weight";
        break;
      case MoeSpec::Naming::kDeepseek:
        router = p + "mlp.gate.weight";
        bias = p + "mlp.gate.e_score_correction_bias";
        expert_prefix = p + "mlp.experts.";
        gate = ".gate_proj.weight";
        up = ".up_proj.weight";
        down = ".down_proj.weight";
        shared_prefix = p + "mlp.shared_experts.";
        break;
    }
  }
};

class MoeBlock final : public FeedForwardBlock {
 public:
  MoeBlock(const ModelSpec& spec, const ShardPlan& plan, int64_t layer, WeightLoader& w, const ShardComms& comms,
           MoeStepStats* stats)
      : m_(spec.moe),
        H_(spec.hidden_size),
        plan_(plan),
        stats_(stats),
        dispatch_(plan.ep_size > 1 ? comms.ep : nullptr, spec.moe.num_experts, spec.hidden_size),
        exchange_(plan.ep_size > 1 ? comms.ep : nullptr, spec.moe.num_experts, spec.hidden_size) {
    const MoeSpec& m = spec.moe;
    SHARDLM_CHECK(m.enabled(), "layer " << layer << ": MoE block without routed experts");
    SHARDLM_CHECK(m.experts_per_token >= 1 && m.experts_per_token <= m.num_experts,
                  "layer " << layer << ": " << m.experts_per_token << " experts per token of " << m.num_experts);
    const int64_t E = m.num_experts, I = m.expert_intermediate, H = H_;
    if (plan.ep_size > 1) {
      SHARDLM_CHECK(comms.ep && comms.ep->size() == plan.ep_size && comms.ep->rank() == plan.ep_rank,
                    "layer " << layer << ": expert parallelism over " << plan.ep_size
                             << " ranks needs the ep communicator of that size (rank " << plan.ep_rank << ")");
      SHARDLM_CHECK(plan.experts == E / plan.ep_size && plan.expert0 == plan.ep_rank * plan.experts &&
                        plan.expert_inter == I,
                    "layer " << layer << ": the shard plan's experts [" << plan.expert0 << ", +" << plan.experts
                             << ") do not match ep rank " << plan.ep_rank << " of " << plan.ep_size);
    } else {
      SHARDLM_CHECK(plan.experts == E && plan.expert0 == 0,
                    "layer " << layer << ": without expert parallelism every rank holds all " << E << " experts");
    }
    const MoeNames n(m, layer);
    router_ = w.whole(n.router, E, H);
    // The router config reproduces route(m, ...): Mixtral always renormalises, softmax otherwise
    // only with norm_topk_prob; the sigmoid selection uses the bias only when the spec has one.
    cfg_.num_experts = E;
    cfg_.k = m.experts_per_token;
    cfg_.sigmoid = m.scoring == MoeSpec::Scoring::kSigmoid;
    cfg_.renormalise = m.norm_topk_prob || m.naming == MoeSpec::Naming::kMixtral;
    cfg_.norm_topk_prob = m.norm_topk_prob;
    cfg_.scale = m.routed_scaling_factor;
    cfg_.n_group = m.n_group;
    cfg_.topk_group = m.topk_group;
    if (m.score_correction_bias) {
      SHARDLM_CHECK(!n.bias.empty(), "layer " << layer << ": e_score_correction_bias needs the DeepSeek naming");
      Vector b = w.vec(n.bias, E);
      if (cfg_.sigmoid) cfg_.bias = b.data;
    }
    const bool sliced = plan.expert_inter < I;
    std::vector<ExpertWeights> experts;
    for (int64_t e = plan.expert0; e < plan.expert0 + plan.experts; ++e) {
      const std::string ep = n.expert_prefix + std::to_string(e);
      ExpertWeights x;
      x.gate = w.rows(ep + n.gate, I, H, plan.expert_inter0, plan.expert_inter);
      x.up = w.rows(ep + n.up, I, H, plan.expert_inter0, plan.expert_inter);
      x.down = sliced ? w.cols(ep + n.down, H, I, plan.expert_inter0, plan.expert_inter) : w.whole(ep + n.down, H, I);
      experts.push_back(x);
    }
    if (!experts.empty() && experts[0].gate.dtype == DType::F8_E4M3) routed_rows_per_expert_ = 16;
    // Gate and up stacked per expert where the backend gains by it: one grouped call for both.
    experts_.assign(std::move(experts), &w.backend());
    if (m.shared_intermediate > 0) {
      SHARDLM_CHECK(!n.shared_prefix.empty(), "layer " << layer << ": the Mixtral naming has no shared expert");
      const int64_t S = m.shared_intermediate;
      shared_inter_ = plan.shared_inter;
      shared_.gate = w.rows(n.shared_prefix + "gate_proj.weight", S, H, plan.shared_inter0, plan.shared_inter);
      shared_.up = w.rows(n.shared_prefix + "up_proj.weight", S, H, plan.shared_inter0, plan.shared_inter);
      shared_.down = plan.shared_inter < S
                         ? w.cols(n.shared_prefix + "down_proj.weight", H, S, plan.shared_inter0, plan.shared_inter)
                         : w.whole(n.shared_prefix + "down_proj.weight", H, S);
      has_shared_ = true;
      if (m.shared_expert_gate) {
        SHARDLM_CHECK(!n.shared_gate.empty(), "layer " << layer << ": shared_expert_gate needs the Qwen naming");
        shared_gate_ = w.whole(n.shared_gate, 1, H);
      }
      // One stacked weight on backends that gain by it (linear_parts): gate, up and the gate logit.
      std::vector<Matrix*> stack = {&shared_.gate, &shared_.up};
      if (shared_gate_) stack.push_back(&*shared_gate_);
      w.backend().make_adjacent(stack);
    }
  }

  void forward(Activations h, const StepContext& ctx, Scratch& scratch, float* out) override {
    const int64_t T = ctx.T;
    if (plan_.ep_size > 1 && ctx.device_routing) {
      forward_expert_parallel_captured(h, ctx, scratch, out);
    } else if (plan_.ep_size > 1) {
      forward_expert_parallel(h, T, ctx.ep_wire, scratch, out);
    } else if (T > 0 && (ctx.device_routing || T * m_.experts_per_token <= routed_rows_per_expert_ * m_.num_experts)) {
      forward_routed(h, ctx, scratch, out);
    } else if (T > 0) {
      forward_on_backend(h, ctx, scratch, out);
    }
  }

 private:
  // The routing's per-expert loads into the statistics, when the step has no device counter
  // (StepContext::expert_tokens; a block driven on its own): from the offsets, read on the host.
  void count_on_host(ComputeBackend& b, const int32_t* offsets) {
    if (!stats_) return;
    const int64_t E = m_.num_experts;
    host_offsets_.resize(static_cast<size_t>(E + 1));
    b.copy_to_host(host_offsets_.data(), offsets, host_offsets_.size() * sizeof(int32_t));
    count(host_offsets_);
  }
  void count(const std::vector<int32_t>& offsets) {
    const int64_t E = m_.num_experts;
    std::vector<int64_t>& per_expert = stats_->expert_tokens;
    if (static_cast<int64_t>(per_expert.size()) < E) per_expert.resize(static_cast<size_t>(E), 0);
    for (int64_t e = 0; e < E; ++e) per_expert[e] += offsets[e + 1] - offsets[e];
    // Nothing is exchanged: dispatch and combine figures (all-to-all time and bytes) stay 0.
  }

  // The routing both ep_size 1 paths start with, in backend memory: the router, the top-k, and the
  // permutation of the (token, expert) pairs by expert (padding rows to none; the expert loads into
  // ctx.expert_tokens when the step counts there). Slots kFeedForward + 0 and 8..12.
  struct Permuted {
    int32_t *ids, *offsets, *slot_row, *row_pair;
    float* weights;
  };
  Permuted route_and_permute(Activations h, const StepContext& ctx, Scratch& scratch) {
    ComputeBackend& b = scratch.backend();
    const int64_t T = ctx.T, E = m_.num_experts, k = m_.experts_per_token, P = T * k;
    float* logits = scratch.get(Scratch::kFeedForward + 0, static_cast<size_t>(T * E));
    Permuted r;
    r.ids = scratch.get_as<int32_t>(Scratch::kFeedForward + 8, static_cast<size_t>(P));
    r.weights = scratch.get(Scratch::kFeedForward + 9, static_cast<size_t>(P));
    r.offsets = scratch.get_as<int32_t>(Scratch::kFeedForward + 10, static_cast<size_t>(E + 1));
    r.slot_row = scratch.get_as<int32_t>(Scratch::kFeedForward + 11, static_cast<size_t>(P));
    r.row_pair = scratch.get_as<int32_t>(Scratch::kFeedForward + 12, static_cast<size_t>(P));
    OpSection s(b, "moe routing");
    b.linear(h, T, router_, nullptr, logits);
    b.moe_route(logits, T, cfg_, r.ids, r.weights);
    b.expert_permute(r.ids, T, k, 0, E, ctx.pos, r.offsets, r.slot_row, r.row_pair, ctx.expert_tokens);
    return r;
  }

  // ep_size 1, T > 0, a large step: the whole layer through backend ops (see the file comment).
  // Slots kFeedForward + 0..3 as add_shared uses them, + 4 for the gathered rows' twin, 5..7 for
  // the experts (arch/expert_ffn.h), + 8 and up for the routing.
  void forward_on_backend(Activations h, const StepContext& ctx, Scratch& scratch, float* out) {
    ComputeBackend& b = scratch.backend();
    const int64_t T = ctx.T, H = H_, E = m_.num_experts, k = m_.experts_per_token, P = T * k;
    const Permuted r = route_and_permute(h, ctx, scratch);
    int32_t* offsets = r.offsets;
    host_offsets_.resize(static_cast<size_t>(E + 1));
    {
      OpSection s(b, "moe routing");
      b.copy_to_host(host_offsets_.data(), offsets, host_offsets_.size() * sizeof(int32_t));
    }
    const int64_t rows = host_offsets_[E];
    SHARDLM_CHECK(rows == P, "moe block: " << rows << " expert rows for " << T << " tokens x top-" << k);

    // Each expert's GEMMs on its contiguous rows, gathered with a twin where the GEMMs read one.
    expert_offsets_.assign(host_offsets_.begin(), host_offsets_.end());
    const ActivationsOut xp{scratch.get(Scratch::kFeedForward + 13, static_cast<size_t>(rows * H)),
                            experts_read_twins(b, experts_)
                                ? scratch.get_as<uint16_t>(Scratch::kFeedForward + 4, static_cast<size_t>(rows * H))
                                : nullptr};
    float* yp = scratch.get(Scratch::kFeedForward + 16, static_cast<size_t>(rows * H));
    {
      OpSection s(b, "moe experts");
      b.expert_gather(h.f32, H, k, r.row_pair, offsets + E, rows, xp);
      run_experts(scratch, experts_, H, xp, expert_offsets_, yp);
    }
    {
      OpSection s(b, "moe combine");
      b.expert_combine(yp, H, r.ids, r.weights, r.slot_row, T, k, out);
    }
    if (stats_ && !ctx.expert_tokens) count(host_offsets_);
    if (has_shared_) add_shared(h, T, scratch, out);
  }

  // ep_size 1, a decode-sized or captured step (StepContext::device_routing): the same ops, but the
  // per-expert rows stay on the device. Padding rows (pos < 0) route to no expert, so
  // rows <= T * k; every buffer is sized for T * k and the expert GEMMs read their row ranges from
  // the permute's offsets (grouped_linear_routed). Same slots as forward_on_backend, 4 for the
  // gathered rows' twin, and run_routed_experts'.
  void forward_routed(Activations h, const StepContext& ctx, Scratch& scratch, float* out) {
    ComputeBackend& b = scratch.backend();
    const int64_t T = ctx.T, H = H_, E = m_.num_experts, k = m_.experts_per_token, P = T * k;
    const Permuted r = route_and_permute(h, ctx, scratch);
    const int32_t* offsets = r.offsets;
    const ActivationsOut xp{scratch.get(Scratch::kFeedForward + 13, static_cast<size_t>(P * H)),
                            b.wants_bf16_twins()
                                ? scratch.get_as<uint16_t>(Scratch::kFeedForward + 4, static_cast<size_t>(P * H))
                                : nullptr};
    float* yp = scratch.get(Scratch::kFeedForward + 16, static_cast<size_t>(P * H));
    {
      OpSection s(b, "moe experts");
      b.expert_gather(h.f32, H, k, r.row_pair, offsets + E, P, xp);
      run_routed_experts(scratch, experts_, xp, P, P, offsets, yp);
    }
    {
      OpSection s(b, "moe combine");
      b.expert_combine(yp, H, r.ids, r.weights, r.slot_row, T, k, out);
    }
    if (!ctx.expert_tokens) count_on_host(b, offsets);
    if (has_shared_) add_shared(h, T, scratch, out);
  }

  // ep_size > 1, any T (0 included: the all-to-alls must pair up on every ep rank). Slots
  // kFeedForward + 0, 8, 9 for the routing, 5..7 for the experts (arch/expert_ffn.h), 10 for their
  // offsets on the routed path, 20 and up for the dispatch (expert_dispatch.h), 0..3 for the shared
  // expert.
  void forward_expert_parallel(Activations h, int64_t T, ExpertWire wire, Scratch& scratch, float* out) {
    ComputeBackend& b = scratch.backend();
    const int64_t H = H_, E = m_.num_experts, k = m_.experts_per_token;
    // This rank's share of the tokens: all of them, or with tp its contiguous tp share (the split a
    // captured step's send plan makes of its real rows).
    const cpu::RowShare share{plan_.tp_rank, plan_.tp_size};
    const int64_t t0 = share.begin(T), t1 = share.end(T);
    const int64_t Ts = t1 - t0;

    // Route the share on the backend; the ids and weights ([Ts, k], small) come to the host,
    // where the dispatch builds its index maps.
    routing_.T = Ts;
    routing_.k = k;
    routing_.experts.resize(static_cast<size_t>(Ts * k));
    routing_.weights.resize(static_cast<size_t>(Ts * k));
    if (Ts > 0) {
      OpSection s(b, "moe routing");
      float* logits = scratch.get(Scratch::kFeedForward + 0, static_cast<size_t>(Ts * E));
      int32_t* ids = scratch.get_as<int32_t>(Scratch::kFeedForward + 8, static_cast<size_t>(Ts * k));
      float* weights = scratch.get(Scratch::kFeedForward + 9, static_cast<size_t>(Ts * k));
      b.linear(h.from(t0 * H), Ts, router_, nullptr, logits);
      b.moe_route(logits, Ts, cfg_, ids, weights);
      b.copy_to_host(routing_.experts.data(), ids, routing_.experts.size() * sizeof(int32_t));
      b.copy_to_host(routing_.weights.data(), weights, routing_.weights.size() * sizeof(float));
    }

    // Dispatch, the local experts, combine (rows outside the share zero). A decode-sized step's
    // experts take the routed GEMMs, as a captured step's do, so the two give the same bits. The
    // exchanged rows come with a twin where the experts' GEMMs read one: the routed calls on bf16
    // or fp8 experts, and run_experts' where experts_read_twins.
    const int64_t L = experts_.size(), routed_rows = routed_rows_per_expert_ * L;
    {
      OpSection s(b, "ep dispatch");
      int64_t twin_rows = 0;
      if (experts_read_twins(b, experts_)) {
        twin_rows = INT64_MAX;
      } else if (experts_.dtype() == DType::F8_E4M3) {
        twin_rows = routed_rows;  // the routed calls' direct kernel reads bf16 rows
      }
      dispatch_.dispatch(scratch, h.f32 + t0 * H, routing_, wire, twin_rows);
    }
    const int64_t rows = dispatch_.rows();
    {
      OpSection s(b, "moe experts");
      if (rows > 0 && rows <= routed_rows) {
        const std::vector<int64_t>& off = dispatch_.offsets();
        host_offsets_.assign(off.begin(), off.end());
        int32_t* offsets = scratch.get_as<int32_t>(Scratch::kFeedForward + 10, static_cast<size_t>(L + 1));
        b.copy_to_device(offsets, host_offsets_.data(), host_offsets_.size() * sizeof(int32_t));
        run_routed_experts(scratch, experts_, dispatch_.input(), rows, rows, offsets, dispatch_.output());
      } else {
        run_experts(scratch, experts_, H, dispatch_.input(), dispatch_.offsets(), dispatch_.output());
      }
    }
    {
      OpSection s(b, "ep combine");
      dispatch_.combine(scratch, out, T, t0);
    }

    if (stats_) {
      std::vector<int64_t>& per_expert = stats_->expert_tokens;
      if (static_cast<int64_t>(per_expert.size()) < E) per_expert.resize(static_cast<size_t>(E), 0);
      for (int32_t e : routing_.experts) ++per_expert[e];
      stats_->dispatch_s += dispatch_.dispatch_seconds;
      stats_->combine_s += dispatch_.combine_seconds;
      stats_->dispatch_bytes += dispatch_.dispatch_bytes;
      stats_->combine_bytes += dispatch_.combine_bytes;
    }
    if (has_shared_ && T > 0) add_shared(h, T, scratch, out);
  }

  // ep_size > 1 in a captured step (StepContext::device_routing): the routing stays on the device
  // and the exchange has fixed sizes (arch/expert_exchange.h); the experts run as forward_routed's
  // do, on at most max_rows() rows whose groups the owner's offsets give on the device. Padding
  // rows go to no expert. Each tp rank routes every row: its share is of the step's real rows, as
  // an eager step of them splits them (cpu::expert_send_plan), which the padded row count of the
  // graph does not give; so a token's routed sum joins the shared expert's tp partial sums in the
  // tp all-reduce on the same rank as in the eager step, and the bits are the same. Slots
  // kFeedForward + 0, 8, 9 for the routing, 5..7 for the experts (run_routed_experts), 30 and up
  // for the exchange, 0..3 for the shared expert.
  void forward_expert_parallel_captured(Activations h, const StepContext& ctx, Scratch& scratch, float* out) {
    ComputeBackend& b = scratch.backend();
    const int64_t T = ctx.T, H = H_, E = m_.num_experts, k = m_.experts_per_token;
    int32_t* ids = scratch.get_as<int32_t>(Scratch::kFeedForward + 8, static_cast<size_t>(std::max<int64_t>(T * k, 1)));
    float* weights = scratch.get(Scratch::kFeedForward + 9, static_cast<size_t>(std::max<int64_t>(T * k, 1)));
    if (T > 0) {
      float* logits = scratch.get(Scratch::kFeedForward + 0, static_cast<size_t>(T * E));
      b.linear(h, T, router_, nullptr, logits);
      b.moe_route(logits, T, cfg_, ids, weights);
    }
    const cpu::ExchangeShape shape = exchange_shape(T, plan_.tp_size, plan_.ep_size, E, k, H, ctx.ep_capacity);
    exchange_.dispatch(scratch, shape, h.f32, ids, T, cpu::RowShare{plan_.tp_rank, plan_.tp_size}, ctx.pos,
                       ctx.expert_tokens, ctx.ep_overflow, ctx.ep_wire);
    // The blocks hold up to ep x Cc rows, a multiple of an owner's usual load: the GEMMs are chosen
    // on that load, the share's pairs (S x k on average), as an eager step of it chooses them.
    const int64_t usual = std::min(exchange_.max_rows(), ((T + plan_.tp_size - 1) / plan_.tp_size) * k);
    run_routed_experts(scratch, experts_, exchange_.input(), exchange_.max_rows(), usual, exchange_.offsets(),
                       exchange_.output());
    exchange_.combine(scratch, ids, weights, out);
    if (stats_) {
      // Loads are counted on the device (ctx.expert_tokens); no time is measured inside a graph.
      stats_->dispatch_bytes += exchange_.dispatch_bytes();
      stats_->combine_bytes += exchange_.combine_bytes();
    }
    if (has_shared_ && T > 0) add_shared(h, T, scratch, out);
  }

  // out [T, H] += g_t * shared(h) per token (g_t = sigmoid of the shared expert gate, or 1). Slots
  // kFeedForward + 1..3.
  void add_shared(Activations h, int64_t T, Scratch& scratch, float* out) {
    ComputeBackend& b = scratch.backend();
    const int64_t H = H_, S = shared_inter_;
    // gate, up and the gate logit one after another: a decode token's stacked projection writes
    // them in place.
    float* sg = scratch.get(Scratch::kFeedForward + 1, static_cast<size_t>(T * (2 * S + 1)));
    float* su = sg + T * S;
    float* g = shared_gate_ ? su + T * S : nullptr;
    float* y = scratch.get(Scratch::kFeedForward + 3, static_cast<size_t>(T * H));
    const ActivationsOut act{sg, b.wants_bf16_twins()
                                     ? scratch.get_as<uint16_t>(Scratch::kFeedForward + 2, static_cast<size_t>(T * S))
                                     : nullptr};
    OpSection s(b, "moe shared expert",
                weight_bytes(shared_.gate) + weight_bytes(shared_.up) + weight_bytes(shared_.down) +
                    (shared_gate_ ? weight_bytes(*shared_gate_) : 0));
    const LinearPart parts[] = {{&shared_.gate, nullptr, sg},
                                {&shared_.up, nullptr, su},
                                {shared_gate_ ? &*shared_gate_ : nullptr, nullptr, g}};
    b.linear_parts(h, T, std::span<const LinearPart>(parts, shared_gate_ ? 3 : 2));
    b.silu_mul(sg, su, act, T * S);
    b.linear(act, T, shared_.down, nullptr, y);
    b.gated_add(out, y, g, T, H);
  }

  MoeSpec m_;
  int64_t H_;
  ShardPlan plan_;
  MoeStepStats* stats_;
  ExpertDispatch dispatch_;  // eager steps with ep
  ExpertExchange exchange_;  // captured steps with ep
  Matrix router_;
  RouterConfig cfg_;  // the routing (its bias is backend memory)
  // Eager steps of up to this many rows per expert on average take the routed path too (an ep
  // owner: its rows over its experts), as captured steps do (decode:
  // no host read in the layer, and a graph step and an eager step of the same rows compute the
  // same bits); larger ones (prefill) take grouped_linear, cuBLAS's grouped GEMMs on tensor cores.
  // The routed kernel reads an expert's weight once per 8 rows: fp8 experts up to 16 rows, where
  // grouped_linear reads the codes directly twice as well (kFp8DirectRows); bf16 and fp32 ones up
  // to 8, where cuBLAS would read the weight once too.
  int64_t routed_rows_per_expert_ = 8;
  LocalExperts experts_;
  bool has_shared_ = false;
  int64_t shared_inter_ = 0;
  ExpertWeights shared_;
  std::optional<Matrix> shared_gate_;
  Routing routing_;                      // the expert-parallel path's routing, host copy
  std::vector<int32_t> host_offsets_;    // the backend path's per-expert row offsets
  std::vector<int64_t> expert_offsets_;  // the same, as run_experts takes them
};

}  // namespace

std::unique_ptr<FeedForwardBlock> make_moe_block(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                 WeightLoader& w, const ShardComms& comms, MoeStepStats* stats) {
  return std::make_unique<MoeBlock>(spec, plan, layer, w, comms, stats);
}

}  // namespace shardlm
