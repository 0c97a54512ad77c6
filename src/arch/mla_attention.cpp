// Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2), computed in the absorbed form.
//
// Per token, with hidden state x (already normed by the decoder):
//   q       = q_b_proj(rmsnorm(q_a_proj x))   or q_proj x when q_lora_rank is 0   [heads, nope + rope]
//   [c, kr] = kv_a_proj_with_mqa x;  c = rmsnorm(c)                                [kv_lora], [rope]
//   q_rope, kr rotated (YaRN or default frequencies over qk_rope_head_dim, HF's rope_interleave)
// The cache keeps [c | kr] per token: one latent shared by all heads, not per-head keys/values.
// kv_b_proj holds, per head h, W_UK_h [nope, kv_lora] (k_nope = W_UK_h c) then W_UV_h [v, kv_lora]
// (v = W_UV_h c). Since q_nope·k_nope = (W_UK_h^T q_nope)·c, attention runs on the latents:
//   q_lat_h  = W_UK_h^T q_nope_h                         (head_linear with W_UK^T, [kv_lora, nope] per head)
//   s_j      = scale * (q_lat_h·c_j + q_rope_h·kr_j);  o_lat_h = sum_j softmax(s)_j c_j
//   v_h      = W_UV_h o_lat_h                            (head_linear with W_UV)
//   out      = o_proj [v_h ...]                          (this rank's heads: a partial sum over tp)
// W_UK^T and W_UV are rearranged at load into weights owned by the block.
//
// Tensor parallelism: heads split over tp (plan.q_head0 / q_heads): q_b_proj (q_proj) and
// kv_b_proj rows by head, o_proj columns by head. q_a / kv_a projections and their norms are
// replicated: every rank computes the latent and keeps the whole latent cache.
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "arch/layer_blocks.h"
#include "arch/rope_freqs.h"
#include "arch/weight_loader.h"
#include "compute/backend.h"
#include "compute/op_profile.h"
#include "core/error.h"
#include "model/checkpoint.h"

namespace shardlm {

namespace {

// DeepSeek's q_a_layernorm and kv_a_layernorm are built with the RMSNorm default eps, not
// config.rms_norm_eps (transformers: DeepseekV3RMSNorm(q_lora_rank), eps = 1e-6).
constexpr float kLatentNormEps = 1e-6f;

class MlaAttention final : public AttentionBlock {
 public:
  MlaAttention(const ModelSpec& spec, const ShardPlan& plan, int64_t layer, WeightLoader& w)
      : b_(w.backend()), nh_(plan.q_heads), q_lora_(spec.mla.q_lora_rank), kv_lora_(spec.mla.kv_lora_rank),
        nope_(spec.mla.qk_nope_head_dim), rope_(spec.mla.qk_rope_head_dim), vdim_(spec.mla.v_head_dim),
        interleave_(spec.mla.rope_interleave) {
    const MlaSpec& m = spec.mla;
    SHARDLM_CHECK(m.enabled(), "MLA attention for layer " << layer << ": kv_lora_rank is 0");
    SHARDLM_CHECK(rope_ > 0 && rope_ % 2 == 0 && nope_ > 0 && vdim_ > 0,
                  "MLA attention: qk_rope_head_dim " << rope_ << " must be positive and even, qk_nope_head_dim "
                                                     << nope_ << " and v_head_dim " << vdim_ << " positive");
    SHARDLM_CHECK(nh_ > 0, "MLA attention: no heads on this rank");
    const int64_t H = spec.hidden_size, NH = spec.num_heads, qk = m.qk_head_dim();
    const int64_t L = kv_lora_, dr = rope_, dv = vdim_;
    const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";

    // Queries: this rank's heads' rows.
    if (q_lora_ > 0) {
      q_a_ = w.whole(p + "q_a_proj.weight", q_lora_, H);
      if (spec.attention_bias) q_a_bias_ = w.vec(p + "q_a_proj.bias", q_lora_);
      q_a_norm_ = w.vec(p + "q_a_layernorm.weight", q_lora_);
      q_b_ = w.rows(p + "q_b_proj.weight", NH * qk, q_lora_, plan.q_head0 * qk, nh_ * qk);
    } else {
      q_b_ = w.rows(p + "q_proj.weight", NH * qk, H, plan.q_head0 * qk, nh_ * qk);
    }
    // The latent and the shared rope key, replicated; split in two so each lands packed.
    const std::string kv_a = p + "kv_a_proj_with_mqa.weight";
    kv_a_latent_ = w.rows(kv_a, L + dr, H, 0, L);
    kv_a_rope_ = w.rows(kv_a, L + dr, H, L, dr);
    if (spec.attention_bias) {
      kv_a_latent_bias_ = w.vec(p + "kv_a_proj_with_mqa.bias", L + dr, 0, L);
      kv_a_rope_bias_ = w.vec(p + "kv_a_proj_with_mqa.bias", L + dr, L, dr);
    }
    kv_a_norm_ = w.vec(p + "kv_a_layernorm.weight", L);
    // The projections of the hidden state (vLLM's fused_qkv_a_proj) as one stacked weight, on
    // backends that gain by it (linear_parts).
    w.backend().make_adjacent(std::array<Matrix*, 3>{q_lora_ > 0 ? &q_a_ : &q_b_, &kv_a_latent_, &kv_a_rope_});
    cache_scale_ = w.kv_scales(p).k;  // an fp8 latent cache: one scale for the whole row
    load_kv_b(w, p + "kv_b_proj.weight", NH, plan.q_head0);
    o_ = w.cols(p + "o_proj.weight", H, NH * dv, plan.q_head0 * dv, nh_ * dv);
    // Row-parallel outputs are summed over the tp group: their bias is added by one rank only.
    if (spec.o_proj_bias && plan.tp_rank == 0) o_bias_ = w.vec(p + "o_proj.bias", H);

    const std::vector<float> inv = rope_inv_freq(spec, dr);
    inv_freq_ = static_cast<float*>(b_.alloc(inv.size() * sizeof(float)));
    b_.copy_to_device(inv_freq_, inv.data(), inv.size() * sizeof(float));
    attention_factor_ = static_cast<float>(rope_attention_factor(spec));
    scale_ = attention_softmax_scale(spec, qk);
  }

  ~MlaAttention() override { b_.free(inv_freq_); }

  int64_t k_width() const override { return kv_lora_ + rope_; }
  int64_t v_width() const override { return 0; }

  void forward(Activations h, const StepContext& ctx, const KvCacheRef& layer_cache, Scratch& scratch,
               float* out) override {
    ComputeBackend& b = scratch.backend();
    const int64_t T = ctx.T;
    if (T == 0) return;
    KvCacheRef cache = layer_cache;
    cache.k_scale = cache.v_scale = cache_scale_;
    const int64_t L = kv_lora_, dr = rope_, dn = nope_, dv = vdim_, nh = nh_, qk = dn + dr;
    // The hidden state's projections one after another (q_a's or q's rows, the latent, the rope
    // key): a decode token's stacked projection writes them in place.
    const int64_t first = q_lora_ > 0 ? q_lora_ : nh * qk;
    float* projected = scratch.get(Scratch::kAttention + 0, T * (first + L + dr));
    float* latent = projected + T * first;
    float* k_rope = latent + T * L;
    float* q = q_lora_ > 0 ? scratch.get(Scratch::kAttention + 1, T * nh * qk) : projected;
    float* q_rope = scratch.get(Scratch::kAttention + 3, T * nh * dr);
    float* q_lat = scratch.get(Scratch::kAttention + 4, T * nh * L);
    float* o_lat = scratch.get(Scratch::kAttention + 5, T * nh * L);
    // The W_UV product's twin feeds o_proj's GEMM (Activations).
    const ActivationsOut v{
        scratch.get(Scratch::kAttention + 6, T * nh * dv),
        b.wants_bf16_twins() ? scratch.get_as<uint16_t>(Scratch::kAttention + 7, T * nh * dv) : nullptr};

    {
      OpSection s(b, "attn qkv",
                  (q_lora_ > 0 ? weight_bytes(q_a_) : 0) + weight_bytes(q_b_) + weight_bytes(kv_a_latent_) +
                      weight_bytes(kv_a_rope_));
      const Matrix& first_w = q_lora_ > 0 ? q_a_ : q_b_;
      const Vector* first_bias = q_lora_ > 0 && q_a_bias_ ? &*q_a_bias_ : nullptr;
      const LinearPart parts[] = {{&first_w, first_bias, projected},
                                  {&kv_a_latent_, kv_a_latent_bias_ ? &*kv_a_latent_bias_ : nullptr, latent},
                                  {&kv_a_rope_, kv_a_rope_bias_ ? &*kv_a_rope_bias_ : nullptr, k_rope}};
      b.linear_parts(h, T, parts);
      if (q_lora_ > 0) {
        const ActivationsOut q_a{
            projected, b.wants_bf16_twins() ? scratch.get_as<uint16_t>(Scratch::kAttention + 2, T * q_lora_) : nullptr};
        b.rmsnorm(projected, q_a_norm_, T, kLatentNormEps, q_a);
        b.linear(q_a, T, q_b_, nullptr, q);
      }
    }
    {
      // The latent's norm, both ropes and the cache write: one launch on the CUDA backend.
      OpSection s(b, "attn rope + cache write");
      b.latent_rope_cache_write(latent, kv_a_norm_, kLatentNormEps, k_rope, q + dn, nh, nh * qk, qk, q_rope, T, L, dr,
                                {ctx.pos, inv_freq_, interleave_, attention_factor_}, ctx.slots, cache);
      if (ctx.kv_amax) {  // the cache row is the latent and the rope key, under one scale
        b.abs_max(latent, T * L, ctx.kv_amax);
        b.abs_max(k_rope, T * dr, ctx.kv_amax);
      }
    }
    {
      // The absorbed form's per-head W_UK (here) and W_UV (after the attention) products.
      OpSection s(b, "attn absorb", weight_bytes(w_uk_t_));
      b.head_linear(q, T, nh, nh * qk, qk, w_uk_t_, q_lat);
    }
    {
      OpSection s(b, "attn core");
      b.latent_attention(q_lat, q_rope, T, nh, L, dr, cache, ctx.block_size, ctx.tables, ctx.pos, scale_, o_lat);
    }
    {
      OpSection s(b, "attn absorb", weight_bytes(w_uv_));
      b.head_linear(o_lat, T, nh, nh * L, L, w_uv_, v);
    }
    OpSection s(b, "attn out", weight_bytes(o_));
    b.linear(v, T, o_, o_bias_ ? &*o_bias_ : nullptr, out);
  }

 private:
  // kv_b_proj rows of this rank's heads, rearranged into W_UK^T [nh * kv_lora, nope] (head h:
  // rows [h*kv_lora, (h+1)*kv_lora), element (c, d) = W_UK_h[d, c]) and W_UV [nh * v, kv_lora]
  // (head h: rows [h*v, (h+1)*v) = W_UV_h), in the loaded dtype (bf16 or f32; exact copies).
  void load_kv_b(WeightLoader& w, const std::string& name, int64_t NH, int64_t head0) {
    const int64_t L = kv_lora_, dn = nope_, dv = vdim_, nh = nh_, per = dn + dv;
    const TensorView kv_b = w.host_rows(name, NH * per, L, head0 * per, nh * per);
    const size_t es = dtype_size(kv_b.dtype);
    const auto* src = static_cast<const uint8_t*>(kv_b.data);
    uk_t_host_.resize(static_cast<size_t>(nh * L * dn) * es);
    uv_host_.resize(static_cast<size_t>(nh * dv * L) * es);
    auto transpose = [&](auto* dst, const auto* s) {
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t c = 0; c < L; ++c) dst[(h * L + c) * dn + d] = s[(h * per + d) * L + c];
    };
    if (es == 2)
      transpose(reinterpret_cast<uint16_t*>(uk_t_host_.data()), reinterpret_cast<const uint16_t*>(src));
    else
      transpose(reinterpret_cast<float*>(uk_t_host_.data()), reinterpret_cast<const float*>(src));
    for (int64_t h = 0; h < nh; ++h)
      std::memcpy(uv_host_.data() + static_cast<size_t>(h * dv * L) * es,
                  src + static_cast<size_t>((h * per + dn) * L) * es, static_cast<size_t>(dv * L) * es);
    // load_matrix may keep a view (cpu): the host buffers live as long as the block.
    auto load = [&](const std::vector<uint8_t>& buf, const std::string& what, int64_t rows, int64_t cols) {
      TensorView t;
      t.name = name + " (" + what + ")";
      t.dtype = kv_b.dtype;
      t.shape = {rows, cols};
      t.data = buf.data();
      t.nbytes = buf.size();
      return b_.load_matrix(t);
    };
    w_uk_t_ = load(uk_t_host_, "W_UK^T", nh * L, dn);
    w_uv_ = load(uv_host_, "W_UV", nh * dv, L);
  }

  ComputeBackend& b_;
  int64_t nh_, q_lora_, kv_lora_, nope_, rope_, vdim_;
  bool interleave_;
  float attention_factor_ = 1.0f, scale_ = 1.0f;
  float* inv_freq_ = nullptr;  // [rope / 2], backend memory
  Matrix q_a_, q_b_, kv_a_latent_, kv_a_rope_, o_, w_uk_t_, w_uv_;
  Vector q_a_norm_, kv_a_norm_;
  std::optional<Vector> q_a_bias_, kv_a_latent_bias_, kv_a_rope_bias_, o_bias_;
  float cache_scale_ = 1.0f;
  std::vector<uint8_t> uk_t_host_, uv_host_;
};

}  // namespace

std::unique_ptr<AttentionBlock> make_mla_attention(const ModelSpec& spec, const ShardPlan& plan, int64_t layer,
                                                   WeightLoader& w) {
  return std::make_unique<MlaAttention>(spec, plan, layer, w);
}

}  // namespace shardlm
