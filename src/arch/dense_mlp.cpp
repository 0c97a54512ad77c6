// SwiGLU MLP: down(silu(gate(x)) * up(x)), optional biases. Column-parallel gate/up, row-parallel
// down: each tensor-parallel rank holds a slice of the intermediate dimension.
#include <array>
#include <optional>

#include "arch/layer_blocks.h"
#include "arch/weight_loader.h"
#include "compute/backend.h"
#include "compute/op_profile.h"

namespace shardlm {

namespace {

class DenseMlp final : public FeedForwardBlock {
 public:
  DenseMlp(const ModelSpec& spec, const ShardPlan& plan, int64_t layer, WeightLoader& w) : inter_(plan.inter) {
    const int64_t H = spec.hidden_size, I = spec.intermediate_size;
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
    gate_ = w.rows(p + "gate_proj.weight", I, H, plan.inter0, plan.inter);
    up_ = w.rows(p + "up_proj.weight", I, H, plan.inter0, plan.inter);
    down_ = w.cols(p + "down_proj.weight", H, I, plan.inter0, plan.inter);
    if (spec.mlp_bias) {
      gate_bias_ = w.vec(p + "gate_proj.bias", I, plan.inter0, plan.inter);
      up_bias_ = w.vec(p + "up_proj.bias", I, plan.inter0, plan.inter);
      if (plan.tp_rank == 0) down_bias_ = w.vec(p + "down_proj.bias", H);
    }
    w.backend().make_adjacent(std::array<Matrix*, 2>{&gate_, &up_});  // one stacked weight (linear_parts)
  }

  void forward(Activations h, const StepContext& ctx, Scratch& scratch, float* out) override {
    const int64_t T = ctx.T;
    if (T == 0) return;
    ComputeBackend& b = scratch.backend();
    // gate then up: a decode token's stacked projection writes both in place.
    float* gate = scratch.get(Scratch::kFeedForward + 0, 2 * T * inter_);
    float* up = gate + T * inter_;
    // silu(gate) * up goes over gate; its twin feeds down's GEMM (Activations).
    const ActivationsOut act{
        gate, b.wants_bf16_twins() ? scratch.get_as<uint16_t>(Scratch::kFeedForward + 2, T * inter_) : nullptr};
    {
      OpSection s(b, "mlp gate/up", weight_bytes(gate_) + weight_bytes(up_));
      const LinearPart gate_up[] = {{&gate_, gate_bias_ ? &*gate_bias_ : nullptr, gate},
                                    {&up_, up_bias_ ? &*up_bias_ : nullptr, up}};
      b.linear_parts(h, T, gate_up);
    }
    {
      OpSection s(b, "mlp activation");
      b.silu_mul(gate, up, act, T * inter_);
    }
    OpSection s(b, "mlp down", weight_bytes(down_));
    b.linear(act, T, down_, down_bias_ ? &*down_bias_ : nullptr, out);
  }

 private:
  int64_t inter_;
  Matrix gate_, up_, down_;
  std::optional<Vector> gate_bias_, up_bias_, down_bias_;
};

}  // namespace

std::unique_ptr<FeedForwardBlock> make_dense_mlp(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                 WeightLoader& w) {
  return std::make_unique<DenseMlp>(spec, plan, layer, w);
}

}  // namespace shardlm
