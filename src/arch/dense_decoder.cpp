#include "arch/dense_decoder.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <cmath>
#include <optional>
#include <string>

#include "arch/rope_freqs.h"
#include "compute/backend.h"
#include "core/error.h"
#include "engine/kv_cache.h"
#include "model/checkpoint.h"
#include "model/tensor_slice.h"
#include "parallel/communicator.h"

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

// Pipeline messages between stages: the residual stream, then logits back to the leader.
constexpr int kTagHidden = 11, kTagLogits = 12;

class DenseDecoder final : public Model {
 public:
  DenseDecoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend, const ShardPlan& plan,
               const ShardComms& comms)
      : spec_(spec), plan_(plan), comms_(comms), b_(backend), scratch_(backend), inv_freq_(rope_inv_freq(spec)) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t H = spec.hidden_size, hd = spec.head_dim, I = spec.intermediate_size;
    const int64_t nq = spec.num_heads * hd, nkv = spec.num_kv_heads * hd;
    // Rows of a weight (output features) are contiguous in the file: views. Columns are gathered.
    auto rows = [&](const std::string& name, const std::vector<int64_t>& shape, int64_t r0, int64_t n) {
      TensorView v = slice_rows(ckpt.get(name, shape), r0, n);
      load_bytes_ += touch_pages(v);
      return v;
    };
    auto cols = [&](const std::string& name, const std::vector<int64_t>& shape, int64_t c0, int64_t n) {
      owned_.emplace_back();
      TensorView v = slice_cols(ckpt.get(name, shape), c0, n, &owned_.back());
      load_bytes_ += v.nbytes;
      return v;
    };
    auto mat_rows = [&](const std::string& name, int64_t R, int64_t C, int64_t r0, int64_t n) {
      return b_.load_matrix(rows(name, {R, C}, r0, n));
    };
    auto mat_cols = [&](const std::string& name, int64_t R, int64_t C, int64_t c0, int64_t n) {
      return b_.load_matrix(cols(name, {R, C}, c0, n));
    };
    auto vec = [&](const std::string& name, int64_t n, int64_t r0, int64_t count) {
      return b_.load_vector(rows(name, {n}, r0, count));
    };
    const int64_t q0 = plan.q_head0 * hd, qn = plan.q_heads * hd;
    const int64_t k0 = plan.kv_head0 * hd, kn = plan.kv_heads * hd;
    if (plan.first_stage()) embed_ = mat_rows("model.embed_tokens.weight", spec.vocab_size, H, plan.vocab0, plan.vocab);
    if (plan.last_stage()) {
      final_norm_ = vec("model.norm.weight", H, 0, H);
      const bool tied = spec.tie_word_embeddings && !ckpt.has("lm_head.weight");
      lm_head_ = mat_rows(tied ? "model.embed_tokens.weight" : "lm_head.weight", spec.vocab_size, H, plan.vocab0,
                          plan.vocab);
    }
    for (int64_t l = plan.first_layer; l < plan.last_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerWeights w;
      w.input_norm = vec(p + "input_layernorm.weight", H, 0, H);
      w.post_attn_norm = vec(p + "post_attention_layernorm.weight", H, 0, H);
      w.q = mat_rows(p + "self_attn.q_proj.weight", nq, H, q0, qn);
      w.k = mat_rows(p + "self_attn.k_proj.weight", nkv, H, k0, kn);
      w.v = mat_rows(p + "self_attn.v_proj.weight", nkv, H, k0, kn);
      w.o = mat_cols(p + "self_attn.o_proj.weight", H, nq, q0, qn);
      if (spec.attention_bias) {
        w.q_bias = vec(p + "self_attn.q_proj.bias", nq, q0, qn);
        w.k_bias = vec(p + "self_attn.k_proj.bias", nkv, k0, kn);
        w.v_bias = vec(p + "self_attn.v_proj.bias", nkv, k0, kn);
      }
      // Row-parallel outputs are summed over the tp group: their bias is added by one rank only.
      if (spec.o_proj_bias && plan.tp_rank == 0) w.o_bias = vec(p + "self_attn.o_proj.bias", H, 0, H);
      if (spec.qk_norm) {
        w.q_norm = vec(p + "self_attn.q_norm.weight", hd, 0, hd);
        w.k_norm = vec(p + "self_attn.k_norm.weight", hd, 0, hd);
      }
      w.gate = mat_rows(p + "mlp.gate_proj.weight", I, H, plan.inter0, plan.inter);
      w.up = mat_rows(p + "mlp.up_proj.weight", I, H, plan.inter0, plan.inter);
      w.down = mat_cols(p + "mlp.down_proj.weight", H, I, plan.inter0, plan.inter);
      if (spec.mlp_bias) {
        w.gate_bias = vec(p + "mlp.gate_proj.bias", I, plan.inter0, plan.inter);
        w.up_bias = vec(p + "mlp.up_proj.bias", I, plan.inter0, plan.inter);
        if (plan.tp_rank == 0) w.down_bias = vec(p + "mlp.down_proj.bias", H, 0, H);
      }
      layers_.push_back(std::move(w));
    }
    inv_freq_dev_ = static_cast<float*>(b_.alloc(inv_freq_.size() * sizeof(float)));
    b_.copy_to_device(inv_freq_dev_, inv_freq_.data(), inv_freq_.size() * sizeof(float));
    load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  ~DenseDecoder() override { b_.free(inv_freq_dev_); }

  const ModelSpec& spec() const override { return spec_; }
  const ShardPlan& shard() const override { return plan_; }
  size_t load_bytes() const override { return load_bytes_; }
  double load_seconds() const override { return load_seconds_; }

  int32_t allocate_kv_cache(int64_t budget_bytes, int64_t block_size, int64_t max_blocks) override {
    KvCacheShape shape;
    shape.num_layers = plan_.last_layer - plan_.first_layer;
    shape.n_kv_heads = plan_.kv_heads;
    shape.head_dim = spec_.head_dim;
    shape.block_size = block_size;
    int64_t blocks = std::min<int64_t>(budget_bytes / shape.bytes_per_block(), max_blocks);
    // Every rank of the replica takes the same block ids: agree on the smallest count.
    if (comms_.replica) comms_.replica->all_reduce(&blocks, 1, CommDType::kI64, ReduceOp::kMin);
    cache_ = std::make_unique<KvCache>(b_, shape, blocks * shape.bytes_per_block(), blocks);
    return cache_->num_blocks();
  }

  // Pipelined on the leader of a multi-stage replica: stage 0's part runs now and the hidden state
  // is handed to stage 1; the logits' receive is posted first, so the last stage can deliver them
  // while the leader already works on the next micro-batch. The hidden state goes by a blocking
  // send: MPI moves large messages only while the sender is inside MPI, and a send left pending
  // through the next micro-batch's compute would hold stage 1 idle.
  int max_steps_in_flight() const override { return leads_pipeline() ? plan_.stages : 1; }

  void begin_step(const ForwardBatch& batch) override {
    if (!leads_pipeline()) return Model::begin_step(batch);
    InFlight f;
    f.rows = static_cast<int64_t>(batch.logit_rows.size());
    const int64_t T = batch.num_tokens();
    if (T > 0) {
      run_stage(batch);
      if (f.rows > 0) {
        f.logits.resize(static_cast<size_t>(f.rows * spec_.vocab_size));
        f.recv = comms_.pp->irecv(f.logits.data(), f.logits.size(), CommDType::kF32, plan_.stages - 1, kTagLogits);
      }
      comms_.pp->send(scratch_.get(0, T * spec_.hidden_size), T * spec_.hidden_size, CommDType::kF32, 1, kTagHidden);
    }
    inflight_.push_back(std::move(f));
  }

  void end_step(float* logits) override {
    if (!leads_pipeline()) return Model::end_step(logits);
    SHARDLM_CHECK(!inflight_.empty(), "end_step without a begun step");
    InFlight& f = inflight_.front();
    if (f.recv) f.recv->wait();
    std::copy(f.logits.begin(), f.logits.end(), logits);
    inflight_.pop_front();
  }

  void forward(const ForwardBatch& batch, float* logits) override {
    const int64_t T = batch.num_tokens();
    if (T == 0) return;
    run_stage(batch);
    const int64_t H = spec_.hidden_size;
    float* residual = scratch_.get(0, T * H);
    if (!plan_.last_stage()) {
      // The leader gets the logits back from the last stage; post that receive before sending on.
      std::unique_ptr<CommRequest> back;
      if (plan_.first_stage() && plan_.tp_rank == 0 && !batch.logit_rows.empty()) {
        back = comms_.pp->irecv(logits, batch.logit_rows.size() * spec_.vocab_size, CommDType::kF32,
                                plan_.stages - 1, kTagLogits);
      }
      comms_.pp->send(residual, T * H, CommDType::kF32, plan_.stage + 1, kTagHidden);
      if (back) back->wait();
      return;
    }
    head(batch, logits);
  }

 private:
  bool leads_pipeline() const { return plan_.stages > 1 && plan_.first_stage() && plan_.tp_rank == 0; }

  // This stage's layers over the batch; the residual stream ends in scratch slot 0.
  void run_stage(const ForwardBatch& batch) {
    SHARDLM_CHECK(cache_, "forward before allocate_kv_cache");
    const int64_t T = batch.num_tokens();
    if (T == 0) return;
    const int64_t H = spec_.hidden_size, hd = spec_.head_dim;
    const int64_t nh = plan_.q_heads, nkv = plan_.kv_heads, I = plan_.inter;
    const float eps = static_cast<float>(spec_.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const int64_t block_size = cache_->shape().block_size;

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
    b_.copy_to_device(pos, batch.positions.data(), T * sizeof(int32_t));
    b_.copy_to_device(slots, batch.slots.data(), T * sizeof(int64_t));
    tables_.resize(T);
    for (int64_t t = 0; t < T; ++t) tables_[t] = batch.blocks.data() + batch.seq_block_start[batch.token_seq[t]];

    if (plan_.first_stage()) {
      // Vocabulary-parallel embedding: each rank fills the rows of the ids it owns, zeros elsewhere.
      local_ids_.resize(T);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t id = batch.tokens[t] - plan_.vocab0;
        local_ids_[t] = (id >= 0 && id < plan_.vocab) ? static_cast<int32_t>(id) : -1;
      }
      b_.copy_to_device(ids, local_ids_.data(), T * sizeof(int32_t));
      b_.embedding(ids, T, embed_, residual);
      tp_sum(residual, T * H);
    } else {
      comms_.pp->recv(residual, T * H, CommDType::kF32, plan_.stage - 1, kTagHidden);
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      const LayerWeights& w = layers_[i];
      const int64_t layer = plan_.first_layer + static_cast<int64_t>(i);
      if (i == 0) {
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
      const int64_t cl = static_cast<int64_t>(i);
      b_.kv_write(k, v, T, slots, nkv, hd, cache_->k(cl), cache_->v(cl));
      const int64_t window = spec_.layer_uses_sliding_window(layer) ? spec_.sliding_window : 0;
      b_.attention(q, T, nh, nkv, hd, cache_->k(cl), cache_->v(cl), block_size, tables_.data(), pos, window, scale,
                   attn);
      b_.linear(attn, T, w.o, w.o_bias ? &*w.o_bias : nullptr, proj);
      tp_sum(proj, T * H);
      b_.add_rmsnorm(residual, proj, w.post_attn_norm, T, eps, h);
      b_.linear(h, T, w.gate, w.gate_bias ? &*w.gate_bias : nullptr, gate);
      b_.linear(h, T, w.up, w.up_bias ? &*w.up_bias : nullptr, up);
      b_.silu_mul(gate, up, gate, T * I);
      b_.linear(gate, T, w.down, w.down_bias ? &*w.down_bias : nullptr, proj);
      tp_sum(proj, T * H);
    }
    b_.add(residual, proj, T * H);
  }

  // The last stage: final norm and the vocabulary-parallel LM head on the rows that sample; the
  // leader's copy of the logits goes to `logits` (or back to the leader over the pipeline).
  void head(const ForwardBatch& batch, float* logits) {
    const int64_t T = batch.num_tokens(), H = spec_.hidden_size;
    const float eps = static_cast<float>(spec_.rms_norm_eps);
    float* residual = scratch_.get(0, T * H);
    // Only the rows that will be sampled go through the final norm and the LM head.
    const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
    if (R == 0) return;
    float* rows = scratch_.get(12, R * H);
    for (int64_t r = 0; r < R; ++r) {
      // Device-to-device gather; on the CPU backend both copies are memcpy.
      const int32_t t = batch.logit_rows[r];
      b_.copy_to_device(rows + r * H, residual + static_cast<int64_t>(t) * H, H * sizeof(float));
    }
    b_.rmsnorm(rows, final_norm_, R, eps, rows);
    const int64_t V = spec_.vocab_size, Vl = plan_.vocab;
    float* local = scratch_.get(13, R * Vl);
    b_.linear(rows, R, lm_head_, nullptr, local);
    std::vector<float>& host = host_logits_;
    host.resize(static_cast<size_t>(R * V));
    if (comms_.tp) {
      // Vocabulary-parallel head: gather the slices ([tp][R][V/tp]) and interleave them per row.
      gathered_.resize(static_cast<size_t>(R * V));
      std::vector<float> mine(static_cast<size_t>(R * Vl));
      b_.copy_to_host(mine.data(), local, mine.size() * sizeof(float));
      comms_.tp->all_gather(mine.data(), gathered_.data(), mine.size(), CommDType::kF32);
      if (plan_.tp_rank != 0) return;
      for (int s = 0; s < plan_.tp_size; ++s) {
        for (int64_t r = 0; r < R; ++r) {
          std::copy_n(gathered_.data() + (static_cast<int64_t>(s) * R + r) * Vl, Vl, host.data() + r * V + s * Vl);
        }
      }
    } else {
      b_.copy_to_host(host.data(), local, host.size() * sizeof(float));
    }
    if (plan_.first_stage()) {
      std::copy(host.begin(), host.end(), logits);
    } else {
      comms_.pp->send(host.data(), host.size(), CommDType::kF32, 0, kTagLogits);
    }
  }

 private:
  struct InFlight {
    std::vector<float> logits;
    std::unique_ptr<CommRequest> recv;
    int64_t rows = 0;
  };

  // Sums a row-parallel partial result over the tensor-parallel group (in host memory for now).
  void tp_sum(float* x, int64_t n) {
    if (comms_.tp) comms_.tp->all_reduce(x, static_cast<size_t>(n), CommDType::kF32, ReduceOp::kSum);
  }

  ModelSpec spec_;
  ShardPlan plan_;
  ShardComms comms_;
  ComputeBackend& b_;
  Scratch scratch_;
  std::vector<float> inv_freq_;
  float* inv_freq_dev_ = nullptr;
  Matrix embed_, lm_head_;
  Vector final_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<std::vector<uint8_t>> owned_;  // gathered column slices (row-parallel weights)
  std::unique_ptr<KvCache> cache_;
  std::vector<const int32_t*> tables_;
  std::vector<int32_t> local_ids_;
  std::vector<float> host_logits_, gathered_;
  std::deque<InFlight> inflight_;  // the leader's begun pipeline steps, oldest first
  size_t load_bytes_ = 0;
  double load_seconds_ = 0;
};

}  // namespace

std::unique_ptr<Model> build_dense_decoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend,
                                           const ShardPlan& plan, const ShardComms& comms) {
  return std::make_unique<DenseDecoder>(spec, ckpt, backend, plan, comms);
}

}  // namespace shardlm
