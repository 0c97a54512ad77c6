#include "arch/dense_decoder.h"

#include <cmath>
#include <optional>
#include <string>

#include "arch/rope_freqs.h"
#include "compute/backend.h"
#include "core/error.h"
#include "engine/kv_cache.h"
#include "model/checkpoint.h"

namespace shardlm {

namespace {

struct LayerWeights {
  Vector input_norm, post_attn_norm;
  Matrix q, k, v, o;
  std::optional<Vector> q_bias, k_bias, v_bias, o_bias;
  std::optional<Vector> q_norm, k_norm;  // Qwen3 per-head norms
  Matrix gate, up, down;
  std::optional<Vector> gate_bias, up_bias, down_bias;
};

// Activation scratch for one step, grown on demand (never shrunk: steps are similar in size).
class Scratch {
 public:
  explicit Scratch(ComputeBackend& b) : b_(b) {}
  ~Scratch() {
    for (auto& s : slots_) b_.free(s.p);
  }
  float* get(int idx, size_t n) {
    if (slots_.size() <= static_cast<size_t>(idx)) slots_.resize(idx + 1);
    auto& s = slots_[idx];
    if (s.n < n) {
      b_.free(s.p);
      s.p = static_cast<float*>(b_.alloc(n * sizeof(float)));
      s.n = n;
    }
    return s.p;
  }

 private:
  struct Slot {
    float* p = nullptr;
    size_t n = 0;
  };
  ComputeBackend& b_;
  std::vector<Slot> slots_;
};

class DenseDecoder final : public Model {
 public:
  DenseDecoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend)
      : spec_(spec), b_(backend), scratch_(backend), inv_freq_(rope_inv_freq(spec)) {
    const int64_t H = spec.hidden_size, hd = spec.head_dim, I = spec.intermediate_size;
    const int64_t nq = spec.num_heads * hd, nkv = spec.num_kv_heads * hd;
    auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
      return b_.load_matrix(ckpt.get(name, {rows, cols}));
    };
    auto vec = [&](const std::string& name, int64_t n) { return b_.load_vector(ckpt.get(name, {n})); };
    embed_ = mat("model.embed_tokens.weight", spec.vocab_size, H);
    final_norm_ = vec("model.norm.weight", H);
    if (spec.tie_word_embeddings && !ckpt.has("lm_head.weight")) {
      lm_head_ = embed_;
    } else {
      lm_head_ = mat("lm_head.weight", spec.vocab_size, H);
    }
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerWeights w;
      w.input_norm = vec(p + "input_layernorm.weight", H);
      w.post_attn_norm = vec(p + "post_attention_layernorm.weight", H);
      w.q = mat(p + "self_attn.q_proj.weight", nq, H);
      w.k = mat(p + "self_attn.k_proj.weight", nkv, H);
      w.v = mat(p + "self_attn.v_proj.weight", nkv, H);
      w.o = mat(p + "self_attn.o_proj.weight", H, nq);
      if (spec.attention_bias) {
        w.q_bias = vec(p + "self_attn.q_proj.bias", nq);
        w.k_bias = vec(p + "self_attn.k_proj.bias", nkv);
        w.v_bias = vec(p + "self_attn.v_proj.bias", nkv);
      }
      if (spec.o_proj_bias) w.o_bias = vec(p + "self_attn.o_proj.bias", H);
      if (spec.qk_norm) {
        w.q_norm = vec(p + "self_attn.q_norm.weight", hd);
        w.k_norm = vec(p + "self_attn.k_norm.weight", hd);
      }
      w.gate = mat(p + "mlp.gate_proj.weight", I, H);
      w.up = mat(p + "mlp.up_proj.weight", I, H);
      w.down = mat(p + "mlp.down_proj.weight", H, I);
      if (spec.mlp_bias) {
        w.gate_bias = vec(p + "mlp.gate_proj.bias", I);
        w.up_bias = vec(p + "mlp.up_proj.bias", I);
        w.down_bias = vec(p + "mlp.down_proj.bias", H);
      }
      layers_.push_back(std::move(w));
    }
    inv_freq_dev_ = static_cast<float*>(b_.alloc(inv_freq_.size() * sizeof(float)));
    b_.copy_to_device(inv_freq_dev_, inv_freq_.data(), inv_freq_.size() * sizeof(float));
  }

  ~DenseDecoder() override { b_.free(inv_freq_dev_); }

  const ModelSpec& spec() const override { return spec_; }

  void forward(const ForwardBatch& batch, KvCache& cache, float* logits) override {
    const int64_t T = batch.num_tokens();
    if (T == 0) return;
    const int64_t H = spec_.hidden_size, hd = spec_.head_dim, I = spec_.intermediate_size;
    const int64_t nh = spec_.num_heads, nkv = spec_.num_kv_heads;
    const float eps = static_cast<float>(spec_.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const auto& kvs = cache.shape();

    float* residual = scratch_.get(0, T * H);
    float* h = scratch_.get(1, T * H);
    float* q = scratch_.get(2, T * nh * hd);
    float* k = scratch_.get(3, T * nkv * hd);
    float* v = scratch_.get(4, T * nkv * hd);
    float* attn = scratch_.get(5, T * nh * hd);
    float* proj = scratch_.get(6, T * H);  // o_proj and down_proj outputs
    float* gate = scratch_.get(7, T * I);
    float* up = scratch_.get(8, T * I);
    int32_t* ids = reinterpret_cast<int32_t*>(scratch_.get(9, T));
    int32_t* pos = reinterpret_cast<int32_t*>(scratch_.get(10, T));
    int64_t* slots = reinterpret_cast<int64_t*>(scratch_.get(11, 2 * T));
    b_.copy_to_device(ids, batch.tokens.data(), T * sizeof(int32_t));
    b_.copy_to_device(pos, batch.positions.data(), T * sizeof(int32_t));
    b_.copy_to_device(slots, batch.slots.data(), T * sizeof(int64_t));

    b_.embedding(ids, T, embed_, residual);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerWeights& w = layers_[l];
      if (l == 0) {
        b_.rmsnorm(residual, w.input_norm, T, eps, h);
      } else {
        b_.add_rmsnorm(residual, proj, w.input_norm, T, eps, h);
      }
      b_.linear(h, T, w.q, w.q_bias ? &*w.q_bias : nullptr, q);
      b_.linear(h, T, w.k, w.k_bias ? &*w.k_bias : nullptr, k);
      b_.linear(h, T, w.v, w.v_bias ? &*w.v_bias : nullptr, v);
      if (w.q_norm) {
        b_.rmsnorm(q, *w.q_norm, T * nh, eps, q);
        b_.rmsnorm(k, *w.k_norm, T * nkv, eps, k);
      }
      b_.rope(q, T, nh, hd, pos, inv_freq_dev_);
      b_.rope(k, T, nkv, hd, pos, inv_freq_dev_);
      b_.kv_write(k, v, T, slots, nkv, hd, cache.k(l), cache.v(l));
      b_.attention(q, T, nh, nkv, hd, cache.k(l), cache.v(l), kvs.block_size, batch.block_tables.data(), pos,
                   spec_.layer_uses_sliding_window(static_cast<int64_t>(l)) ? spec_.sliding_window : 0, scale, attn);
      b_.linear(attn, T, w.o, w.o_bias ? &*w.o_bias : nullptr, proj);
      b_.add_rmsnorm(residual, proj, w.post_attn_norm, T, eps, h);
      b_.linear(h, T, w.gate, w.gate_bias ? &*w.gate_bias : nullptr, gate);
      b_.linear(h, T, w.up, w.up_bias ? &*w.up_bias : nullptr, up);
      b_.silu_mul(gate, up, gate, T * I);
      b_.linear(gate, T, w.down, w.down_bias ? &*w.down_bias : nullptr, proj);
    }
    // Only the rows that will be sampled go through the final norm and the LM head.
    const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
    if (R == 0) return;
    b_.add(residual, proj, T * H);
    float* rows = scratch_.get(12, R * H);
    for (int64_t r = 0; r < R; ++r) {
      // Device-to-device gather; on the CPU backend both copies are memcpy.
      const int32_t t = batch.logit_rows[r];
      b_.copy_to_device(rows + r * H, residual + static_cast<int64_t>(t) * H, H * sizeof(float));
    }
    b_.rmsnorm(rows, final_norm_, R, eps, rows);
    float* out = scratch_.get(13, R * spec_.vocab_size);
    b_.linear(rows, R, lm_head_, nullptr, out);
    b_.copy_to_host(logits, out, R * spec_.vocab_size * sizeof(float));
  }

 private:
  ModelSpec spec_;
  ComputeBackend& b_;
  Scratch scratch_;
  std::vector<float> inv_freq_;
  float* inv_freq_dev_ = nullptr;
  Matrix embed_, lm_head_;
  Vector final_norm_;
  std::vector<LayerWeights> layers_;
};

}  // namespace

std::unique_ptr<Model> build_dense_decoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend) {
  return std::make_unique<DenseDecoder>(spec, ckpt, backend);
}

}  // namespace shardlm
