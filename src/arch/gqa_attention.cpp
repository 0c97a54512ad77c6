// Grouped-query attention (Llama, Mistral, Qwen2, Qwen3): q/k/v projections with optional biases,
// optional per-head QK RMSNorm, RoPE, paged KV cache, optional sliding window, o_proj.
#include <array>
#include <cmath>
#include <optional>

#include "arch/layer_blocks.h"
#include "arch/weight_loader.h"
#include "compute/backend.h"
#include "compute/op_profile.h"

namespace shardlm {

namespace {

class GqaAttention final : public AttentionBlock {
 public:
  GqaAttention(const ModelSpec& spec, const ShardPlan& plan, int64_t layer, WeightLoader& w, const float* inv_freq)
      : nh_(plan.q_heads), nkv_(plan.kv_heads), hd_(spec.head_dim), inv_freq_(inv_freq),
        eps_(static_cast<float>(spec.rms_norm_eps)),
        window_(spec.layer_uses_sliding_window(layer) ? spec.sliding_window : 0) {
    const int64_t H = spec.hidden_size, hd = spec.head_dim;
    const int64_t nq = spec.num_heads * hd, nkv = spec.num_kv_heads * hd;
    const int64_t q0 = plan.q_head0 * hd, qn = plan.q_heads * hd;
    const int64_t k0 = plan.kv_head0 * hd, kn = plan.kv_heads * hd;
    const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
    q_ = w.rows(p + "q_proj.weight", nq, H, q0, qn);
    k_ = w.rows(p + "k_proj.weight", nkv, H, k0, kn);
    v_ = w.rows(p + "v_proj.weight", nkv, H, k0, kn);
    o_ = w.cols(p + "o_proj.weight", H, nq, q0, qn);
    if (spec.attention_bias) {
      q_bias_ = w.vec(p + "q_proj.bias", nq, q0, qn);
      k_bias_ = w.vec(p + "k_proj.bias", nkv, k0, kn);
      v_bias_ = w.vec(p + "v_proj.bias", nkv, k0, kn);
    }
    // Row-parallel outputs are summed over the tp group: their bias is added by one rank only.
    if (spec.o_proj_bias && plan.tp_rank == 0) o_bias_ = w.vec(p + "o_proj.bias", H);
    if (spec.qk_norm) {
      q_norm_ = w.vec(p + "q_norm.weight", hd);
      k_norm_ = w.vec(p + "k_norm.weight", hd);
    }
    scales_ = w.kv_scales(p);
    // One stacked weight on backends that gain by it (linear_parts).
    w.backend().make_adjacent(std::array<Matrix*, 3>{&q_, &k_, &v_});
  }

  int64_t k_width() const override { return nkv_ * hd_; }
  int64_t v_width() const override { return nkv_ * hd_; }

  void forward(Activations h, const StepContext& ctx, const KvCacheRef& layer_cache, Scratch& scratch,
               float* out) override {
    ComputeBackend& b = scratch.backend();
    const int64_t T = ctx.T;
    if (T == 0) return;
    KvCacheRef cache = layer_cache;  // an fp8 cache reads this layer's scales
    cache.k_scale = scales_.k;
    cache.v_scale = scales_.v;
    // q, k and v one after another: a decode token's stacked projection writes them in place.
    float* q = scratch.get(Scratch::kAttention + 0, T * (nh_ + 2 * nkv_) * hd_);
    float* k = q + T * nh_ * hd_;
    float* v = k + T * nkv_ * hd_;
    // The attention output's twin feeds o_proj's GEMM (Activations).
    const ActivationsOut attn{
        scratch.get(Scratch::kAttention + 3, T * nh_ * hd_),
        b.wants_bf16_twins() ? scratch.get_as<uint16_t>(Scratch::kAttention + 4, T * nh_ * hd_) : nullptr};
    {
      OpSection s(b, "attn qkv", weight_bytes(q_) + weight_bytes(k_) + weight_bytes(v_));
      const LinearPart qkv[] = {{&q_, q_bias_ ? &*q_bias_ : nullptr, q},
                                {&k_, k_bias_ ? &*k_bias_ : nullptr, k},
                                {&v_, v_bias_ ? &*v_bias_ : nullptr, v}};
      b.linear_parts(h, T, qkv);
    }
    {
      // Qwen3's q/k norms, rope and the cache write: one launch on the CUDA backend.
      OpSection s(b, "attn rope + cache write");
      b.rope_kv_write(q, nh_, k, v, nkv_, T, hd_, {q_norm_ ? &*q_norm_ : nullptr, k_norm_ ? &*k_norm_ : nullptr, eps_},
                      ctx.pos, inv_freq_, ctx.slots, ctx.block_size, cache);
      // Calibration reads the keys as the cache got them: normed and rotated.
      if (ctx.kv_amax) {
        b.abs_max(k, T * nkv_ * hd_, ctx.kv_amax);
        b.abs_max(v, T * nkv_ * hd_, ctx.kv_amax + 1);
      }
    }
    {
      OpSection s(b, "attn core");
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
      b.attention(q, T, nh_, nkv_, hd_, cache, ctx.block_size, ctx.tables, ctx.pos, window_, scale, attn);
    }
    OpSection s(b, "attn out", weight_bytes(o_));
    b.linear(attn, T, o_, o_bias_ ? &*o_bias_ : nullptr, out);
  }

 private:
  int64_t nh_, nkv_, hd_;
  const float* inv_freq_;
  float eps_;
  int64_t window_;
  Matrix q_, k_, v_, o_;
  std::optional<Vector> q_bias_, k_bias_, v_bias_, o_bias_;
  std::optional<Vector> q_norm_, k_norm_;  // Qwen3 per-head norms
  WeightLoader::KvScales scales_;
};

}  // namespace

std::unique_ptr<AttentionBlock> make_gqa_attention(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                   WeightLoader& w, const float* inv_freq_dev) {
  return std::make_unique<GqaAttention>(spec, plan, layer, w, inv_freq_dev);
}

}  // namespace shardlm
