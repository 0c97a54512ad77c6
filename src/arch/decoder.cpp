#include "arch/decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>

#include "arch/expert_counter.h"
#include "arch/kv_magnitudes.h"
#include "arch/layer_blocks.h"
#include "arch/pipeline_choices.h"
#include "arch/stage_clock.h"
#include "arch/stage_figures.h"
#include "arch/rope_freqs.h"
#include "arch/scratch.h"
#include "arch/step_graphs.h"
#include "arch/weight_loader.h"
#include "compute/backend.h"
#include "compute/op_profile.h"
#include "core/error.h"
#include "engine/kv_cache.h"
#include "model/checkpoint.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

// One decoder layer: its two norms and blocks.
struct Layer {
  Vector input_norm, post_attn_norm;
  std::unique_ptr<AttentionBlock> attn;
  std::unique_ptr<FeedForwardBlock> ffn;
};

// Pipeline messages: the residual stream, the step's logits (or a sampled step's choices,
// arch/pipeline_choices.h) back to the leader, the later stages' figures (arch/stage_figures.h).
constexpr int kTagHidden = 11, kTagLogits = 12;
// The scratch slot where a later stage's graph step receives the previous stage's hidden states.
constexpr int kStageInput = 17;
// The bf16 twins (compute/backend.h Activations) of the normed hidden state (slot 1) and of the
// final norm's rows (slot 12), where the backend wants them.
constexpr int kHiddenTwin = 18, kFinalRowsTwin = 19;

class Decoder final : public Model {
 public:
  Decoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend, const ShardPlan& plan,
          const ShardComms& comms)
      : spec_(spec),
        plan_(plan),
        comms_(comms),
        clock_(comms),
        b_(backend),
        scratch_(backend),
        graphs_(backend, scratch_, spec_, plan_, comms_),
        expert_counter_(backend, spec.moe.enabled() ? spec.moe.num_experts : 0),
        inv_freq_(rope_inv_freq(spec)),
        kv_amax_(backend) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t H = spec.hidden_size;
    inv_freq_dev_ = static_cast<float*>(b_.alloc(inv_freq_.size() * sizeof(float)));
    b_.copy_to_device(inv_freq_dev_, inv_freq_.data(), inv_freq_.size() * sizeof(float));
    if (spec.moe.enabled()) moe_stats_.reset(spec.moe.num_experts);
    // The loader owns the gathered and dequantised slices the backend may use in place: it lives
    // as long as the model.
    weights_ = std::make_unique<WeightLoader>(ckpt, b_, spec.quant.block_rows, spec.quant.block_cols);
    WeightLoader& w = *weights_;
    // Tied embeddings saved under lm_head.weight alone serve as the table too (transformers ties
    // them whichever of the two the file holds).
    const bool table_in_lm_head =
        spec.tie_word_embeddings && !ckpt.has("model.embed_tokens.weight") && ckpt.has("lm_head.weight");
    if (plan.first_stage())
      embed_ = w.rows(table_in_lm_head ? "lm_head.weight" : "model.embed_tokens.weight", spec.vocab_size, H,
                      plan.vocab0, plan.vocab, WeightUse::kTable);
    if (plan.last_stage()) {
      final_norm_ = w.vec("model.norm.weight", H);
      const bool tied = spec.tie_word_embeddings && !ckpt.has("lm_head.weight");
      lm_head_ = w.rows(tied ? "model.embed_tokens.weight" : "lm_head.weight", spec.vocab_size, H, plan.vocab0,
                        plan.vocab);
    }
    for (int64_t l = plan.first_layer; l < plan.last_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer layer;
      layer.input_norm = w.vec(p + "input_layernorm.weight", H);
      layer.post_attn_norm = w.vec(p + "post_attention_layernorm.weight", H);
      layer.attn = spec.mla.enabled() ? make_mla_attention(spec, plan, l, w)
                                      : make_gqa_attention(spec, plan, l, w, inv_freq_dev_);
      layer.ffn = spec.moe.layer_is_moe(l) ? make_moe_block(spec, plan, l, w, comms, &moe_stats_)
                                           : make_dense_mlp(spec, plan, l, w);
      layers_.push_back(std::move(layer));
    }
    load_bytes_ = w.bytes();
    load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  ~Decoder() override { b_.free(inv_freq_dev_); }

  void record_kv_magnitudes() override {
    kv_amax_.start(layers_.size());
    graphs_.disable();
  }
  std::vector<float> kv_magnitudes() const override { return kv_amax_.read(plan_.first_layer, spec_.num_layers); }

  const ModelSpec& spec() const override { return spec_; }
  const ShardPlan& shard() const override { return plan_; }
  size_t load_bytes() const override { return load_bytes_; }
  double load_seconds() const override { return load_seconds_; }

  KvCacheShape kv_shape(int64_t block_size, DType dtype) const {
    KvCacheShape shape;
    shape.dtype = dtype;
    shape.num_layers = plan_.last_layer - plan_.first_layer;
    shape.k_width = layers_.empty() ? 0 : layers_[0].attn->k_width();
    shape.v_width = layers_.empty() ? 0 : layers_[0].attn->v_width();
    shape.block_size = block_size;
    return shape;
  }
  int64_t kv_blocks_fitting(int64_t budget_bytes, int64_t block_size, DType dtype) const override {
    const int64_t per_block = kv_shape(block_size, dtype).bytes_per_block();
    return per_block > 0 ? budget_bytes / per_block : std::numeric_limits<int64_t>::max();
  }
  int32_t allocate_kv_cache(int64_t budget_bytes, int64_t block_size, int64_t max_blocks, DType dtype) override {
    const KvCacheShape shape = kv_shape(block_size, dtype);
    const int64_t own = std::min<int64_t>(budget_bytes / shape.bytes_per_block(), max_blocks);
    int64_t blocks = own;
    // Every rank of the replica takes the same block ids: agree on the smallest count.
    if (comms_.replica) comms_.replica->all_reduce(&blocks, 1, CommDType::kI64, ReduceOp::kMin);
    SHARDLM_CHECK(blocks >= 1, "KV cache: " << (own < 1 ? "this rank's" : "another rank of the replica has a")
                                            << " budget "
                                            << (own < 1 ? "of " + std::to_string(budget_bytes) + " bytes " : "that ")
                                            << "holds no block of " << shape.bytes_per_block() << " bytes ("
                                            << block_size << " tokens); raise --kv-cache-gb");
    // Captured steps hold the old cache's layer pointers: they go with it.
    graphs_.drop();
    cache_.reset();  // a budget sized by the free memory counts on the old cache's being gone
    cache_ = std::make_unique<KvCache>(b_, shape, blocks * shape.bytes_per_block(), blocks);
    return cache_->num_blocks();
  }
  void release_kv_cache() override {
    graphs_.drop();
    cache_.reset();
  }

  // Pipelined on the leader of a multi-stage replica: stage 0's part runs now and the hidden state
  // is handed to stage 1; the logits' receive is posted first, so the last stage can deliver them
  // while the leader already works on the next micro-batch. The hidden state goes by a blocking
  // send: MPI moves large messages only while the sender is inside MPI, and a send left pending
  // through the next micro-batch's compute would hold stage 1 idle.
  int max_steps_in_flight() const override { return leads_pipeline() ? plan_.stages : 1; }

  // With one stage the step runs now and its whole logits (gathered over tp) stay in device
  // scratch until end_step copies them out or end_step_sampled samples them there (one step in
  // flight at most: max_steps_in_flight() is 1 without stages).
  void begin_step(const ForwardBatch& batch) override {
    const bool sampled = batch.sampled();
    if (logits_end_here()) {
      SHARDLM_CHECK(!device_step_, "begin_step before the previous step was ended");
      StageClock::Part part(clock_);
      begin_profiled_step(batch);
      device_step_ = DeviceStep{step_to_device(batch), static_cast<int64_t>(batch.logit_rows.size()), batch.sample_rows,
                                batch.token_edits};
      return;
    }
    if (!leads_pipeline()) return Model::begin_step(batch);
    InFlight f;
    f.rows = static_cast<int64_t>(batch.logit_rows.size());
    f.sampled = sampled;
    const int64_t T = batch.num_tokens();
    if (T > 0 || runs_empty_steps()) {
      // The leader's part of the step: its stage and the send on.
      clock_.start();
      begin_profiled_step(batch);
      stage_to_device(batch);
      if (f.rows > 0 && sampled) {
        f.top = top_entries(batch.sample_rows.data(), f.rows);
        f.choices.resize(choices_length(f.rows, f.top));
        f.recv = comms_.pp->irecv(f.choices.data(), f.choices.size(), CommDType::kI32, plan_.stages - 1, kTagLogits);
      } else if (f.rows > 0) {
        f.logits.resize(static_cast<size_t>(f.rows * spec_.vocab_size));
        f.recv = comms_.pp->irecv(f.logits.data(), f.logits.size(), CommDType::kF32, plan_.stages - 1, kTagLogits);
      }
      f.figures_recv = receive_later_stages(&f.later);
      comms_.pp->send(scratch_.get(0, std::max<int64_t>(T, 1) * spec_.hidden_size), T * spec_.hidden_size,
                      CommDType::kF32, 1, kTagHidden);
      end_profiled_step();
      f.own = clock_.take();
    }
    if (spec_.moe.enabled()) f.moe = moe_stats_;
    inflight_.push_back(std::move(f));
  }

  void end_step(float* logits) override {
    if (logits_end_here()) {
      {
        StageClock::Part part(clock_);
        const DeviceStep step = take_device_step(false);
        if (step.rows > 0) b_.copy_to_host(logits, step.logits, step.rows * spec_.vocab_size * sizeof(float));
        end_profiled_step();
      }
      last_stages_.assign(1, clock_.take());
      return;
    }
    if (!leads_pipeline()) return Model::end_step(logits);
    InFlight f = take_inflight(false);
    std::copy(f.logits.begin(), f.logits.end(), logits);
  }

  // The choices are made where the logits end, by the backend's sample op (on the device): here
  // with one stage (after the tp gather), on the last stage's tp rank 0 with several, which sends
  // back only the choices (2R values and the rows' top alternatives instead of R x vocab logits).
  void end_step_sampled(StepChoices* out) override {
    if (logits_end_here()) {
      {
        StageClock::Part part(clock_);
        const DeviceStep step = take_device_step(true);
        out->resize(0, 0);
        if (step.rows > 0) {
          OpSection s(b_, "sampling");
          out->sample(b_, step.logits, spec_.vocab_size, step.sample_rows, step.token_edits);
        }
        end_profiled_step();
      }
      last_stages_.assign(1, clock_.take());
      return;
    }
    if (!leads_pipeline()) return Model::end_step_sampled(out);
    InFlight f = take_inflight(true);
    unpack_choices(f.choices, f.rows, f.top, out);
  }

  bool runs_empty_steps() const override { return comms_.ep != nullptr; }

  std::string enable_step_graphs(double ep_capacity) override {
    return graphs_.enable(ep_capacity, kv_amax_.recording());
  }
  void set_expert_wire(ExpertWire wire) override {
    if (wire != ep_wire_) graphs_.drop();  // captured steps hold the exchanges of the old wire
    ep_wire_ = wire;
  }
  int64_t graph_steps() const override { return graphs_.steps(); }
  int64_t graph_reruns() const override { return graphs_.reruns(); }
  int64_t graph_nodes(int64_t bucket) const override { return graphs_.nodes(bucket); }
  const MoeStepStats* last_step_moe() const override {
    return spec_.moe.enabled() ? (leads_pipeline() ? &last_moe_ : &moe_stats_) : nullptr;
  }
  const std::vector<StageSeconds>* last_step_stages() const override { return &last_stages_; }

  void forward(const ForwardBatch& batch, float* logits) override {
    const int64_t T = batch.num_tokens();
    if (T == 0 && !runs_empty_steps()) return;
    if (logits_end_here()) {
      // The same device step as begin_step (graph or eager), then its logits to the host (the
      // other tp ranks pass no buffer).
      const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
      {
        StageClock::Part part(clock_);
        begin_profiled_step(batch);
        if (const float* dev = step_to_device(batch); dev && R > 0 && logits)
          b_.copy_to_host(logits, dev, R * spec_.vocab_size * sizeof(float));
        end_profiled_step();
      }
      last_stages_.assign(1, clock_.take());
      return;
    }
    // A stage of several: this rank's part of the step, to its send on (the leader: with the wait
    // for the logits).
    begin_profiled_step(batch);
    forward_stage(batch, logits);
    end_profiled_step();
  }

 private:
  // forward() on a stage of several.
  void forward_stage(const ForwardBatch& batch, float* logits) {
    clock_.start();
    const int64_t T = batch.num_tokens();
    const float* graph_logits = stage_to_device(batch);
    const int64_t H = spec_.hidden_size;
    float* residual = scratch_.get(0, std::max<int64_t>(T, 1) * H);
    if (!plan_.last_stage()) {
      // The leader gets the logits back from the last stage; post that receive before sending on.
      std::unique_ptr<CommRequest> back, figures_back;
      if (plan_.first_stage() && plan_.tp_rank == 0 && !batch.logit_rows.empty()) {
        SHARDLM_CHECK(!batch.sampled(), "a sampled step through pipeline stages is run with begin_step and "
                                        "end_step_sampled (the last stage returns choices, not logits)");
        back = comms_.pp->irecv(logits, batch.logit_rows.size() * spec_.vocab_size, CommDType::kF32,
                                plan_.stages - 1, kTagLogits);
      }
      if (leads_pipeline()) figures_back = receive_later_stages(&figures_wire_);
      comms_.pp->send(residual, T * H, CommDType::kF32, plan_.stage + 1, kTagHidden);
      const StageSeconds own = clock_.take();
      stage_figures_on(own);
      if (back) back->wait();
      if (figures_back) {
        figures_back->wait();
        collect_stages(own, figures_wire_, moe_stats_);
      }
      return;
    }
    head(batch, graph_logits);
    stage_figures_on(clock_.take());
  }

  // The leader's receive of the later stages' figures (arch/stage_figures.h).
  std::unique_ptr<CommRequest> receive_later_stages(std::vector<int64_t>* wire) {
    return shardlm::receive_later_stages(*comms_.pp, plan_.stages, spec_.moe.enabled() ? spec_.moe.num_experts : 0,
                                         wire);
  }
  // A later stage's tp rank 0, after its part of the step: the figures passed on.
  void stage_figures_on(StageSeconds own) {
    if (plan_.first_stage() || plan_.tp_rank != 0) return;
    pass_figures_on(*comms_.pp, plan_.stage, plan_.stages, spec_.moe.enabled() ? &moe_stats_ : nullptr, own,
                    &figures_wire_);
  }
  // The leader, the later stages' figures received: the step's figures over every stage (own:
  // stage 0's seconds, moe: its MoE figures).
  void collect_stages(StageSeconds own, const std::vector<int64_t>& wire, const MoeStepStats& moe) {
    if (spec_.moe.enabled()) last_moe_ = moe;
    last_stages_.assign(static_cast<size_t>(plan_.stages), StageSeconds{});
    last_stages_[0] = own;
    read_later_stages(wire, plan_.stages, spec_.moe.enabled() ? &last_moe_ : nullptr, &last_stages_);
  }

  bool leads_pipeline() const { return plan_.stages > 1 && plan_.first_stage() && plan_.tp_rank == 0; }
  // One stage: the step's logits end whole (gathered over tp) in this rank's backend memory, and
  // the leader samples them there (see end_step_sampled).
  bool logits_end_here() const { return plan_.stages == 1; }

  // The op profile's steps (compute/op_profile.h), this rank's part of each: a step of one token
  // a sequence, each with its logit row, is decode (a prefill chunk whose every prompt position is
  // scored has a row per token too, but several tokens a sequence), any other prefill (its decode
  // tokens ride along), a step of no tokens (an expert-parallel rank's turn in its group's
  // exchanges) empty.
  void begin_profiled_step(const ForwardBatch& batch) {
    OpProfile* p = b_.op_profile();
    if (!p) return;
    const int64_t T = batch.num_tokens();
    const bool decode = T > 0 && static_cast<int64_t>(batch.logit_rows.size()) == T &&
                        static_cast<int64_t>(batch.seq_block_start.size()) == T + 1;
    p->begin_step(T == 0 ? "empty" : decode ? "decode" : "prefill");
  }
  void end_profiled_step() {
    if (OpProfile* p = b_.op_profile(); p && p->in_step()) p->end_step();
  }

  // A begun step whose logits ([rows, vocab]) wait in backend memory (logits_end_here()).
  struct DeviceStep {
    const float* logits = nullptr;  // null when no row samples
    int64_t rows = 0;
    std::vector<SampleRow> sample_rows;
    std::vector<TokenEdit> token_edits;
  };
  DeviceStep take_device_step(bool sampled) {
    SHARDLM_CHECK(device_step_, "ending a step that was not begun");
    DeviceStep step = std::move(*device_step_);
    device_step_.reset();
    check_end(sampled, !step.sample_rows.empty(), step.rows);
    return step;
  }
  // The pipelined leader's oldest step, its result received.
  struct InFlight;
  InFlight take_inflight(bool sampled) {
    SHARDLM_CHECK(!inflight_.empty(), "ending a step that was not begun");
    InFlight f = std::move(inflight_.front());
    inflight_.pop_front();
    if (f.recv) f.recv->wait();
    if (f.figures_recv) {
      f.figures_recv->wait();
      collect_stages(f.own, f.later, f.moe);
    } else {
      if (spec_.moe.enabled()) last_moe_ = std::move(f.moe);
      last_stages_.assign(static_cast<size_t>(plan_.stages), StageSeconds{});  // a step no stage ran
    }
    check_end(sampled, f.sampled, f.rows);
    return f;
  }
  // A step with sample rows is ended by end_step_sampled, one without by end_step.
  static void check_end(bool by_sampled, bool sampled, int64_t rows) {
    if (rows == 0) return;
    SHARDLM_CHECK(by_sampled == sampled,
                  (sampled ? "end_step on a step begun with sample rows (end it with end_step_sampled)"
                           : "end_step_sampled on a step begun without sample rows (end it with end_step)"));
  }

  // The step's graph bucket (StepGraphs::step_bucket); 0: it runs eagerly.
  int64_t graph_bucket_of(const ForwardBatch& batch) {
    if (!cache_) return 0;  // forward before allocate_kv_cache: run_stage names the mistake
    return graphs_.step_bucket(batch, *cache_, [&](int64_t rows) {
      if (!plan_.first_stage()) scratch_.get(kStageInput, rows * spec_.hidden_size);
    });
  }

  // Runs the whole step (graph or eager) and returns its logits in backend memory, or null when no
  // row samples. Only with logits_end_here().
  const float* step_to_device(const ForwardBatch& batch) {
    const int64_t T = batch.num_tokens();
    if (T == 0 && !runs_empty_steps()) return nullptr;
    if (const int64_t bucket = graph_bucket_of(batch); bucket > 0) return graph_step(batch, bucket);
    run_stage(batch);
    return logits_to_device(batch);
  }

  // This stage's part of a step of several stages, by its graph when the step is graph-eligible
  // (graph_step), else eagerly (run_stage): the residual stream ends in slot 0 either way. On the
  // last stage a graph also computes the logits; they are returned (in backend memory, [T, vocab]
  // first, gathered over tp), null otherwise (head() computes them).
  const float* stage_to_device(const ForwardBatch& batch) {
    if (const int64_t bucket = graph_bucket_of(batch); bucket > 0) return graph_step(batch, bucket);
    run_stage(batch);
    return nullptr;
  }

  // This stage's layers over the batch; the residual stream ends in scratch slot 0. With expert
  // parallelism it runs even on an empty step, so that the all-to-alls of its MoE layers pair up.
  // received: a later stage's input is already in the kStageInput slot (a graph step redone).
  void run_stage(const ForwardBatch& batch, bool received = false) {
    SHARDLM_CHECK(cache_, "forward before allocate_kv_cache");
    const int64_t T = batch.num_tokens();
    if (spec_.moe.enabled()) moe_stats_.reset(spec_.moe.num_experts);
    if (T == 0 && !runs_empty_steps()) return;
    const int64_t H = spec_.hidden_size;
    const size_t rows = static_cast<size_t>(std::max<int64_t>(T, 1));

    float* residual = scratch_.get(0, rows * H);
    const ActivationsOut h = normed_rows(1, kHiddenTwin, rows * H);
    float* proj = scratch_.get(2, rows * H);  // attention and feed-forward outputs
    int32_t* ids = scratch_.get_as<int32_t>(3, rows);
    StepContext ctx;
    {
      OpSection inputs(b_, "step inputs");
      ctx.batch = &batch;
      ctx.T = T;
      ctx.pos = scratch_.get_as<int32_t>(4, rows);
      ctx.slots = scratch_.get_as<int64_t>(5, rows);
      ctx.block_size = cache_->shape().block_size;
      ctx.ep_wire = ep_wire_;
      // An eager expert-parallel layer counts its loads on the host.
      ctx.expert_tokens = comms_.ep ? nullptr : expert_counter_.device();
      if (ctx.expert_tokens) expert_counter_.zero();
      b_.copy_to_device(const_cast<int32_t*>(ctx.pos), batch.positions.data(), T * sizeof(int32_t));
      b_.copy_to_device(const_cast<int64_t*>(ctx.slots), batch.slots.data(), T * sizeof(int64_t));
      table_start_.resize(T);
      for (int64_t t = 0; t < T; ++t) table_start_[t] = batch.seq_block_start[batch.token_seq[t]];
      int32_t* blocks = scratch_.get_as<int32_t>(6, std::max<size_t>(batch.blocks.size(), 1));
      int32_t* start = scratch_.get_as<int32_t>(7, rows);
      b_.copy_to_device(blocks, batch.blocks.data(), batch.blocks.size() * sizeof(int32_t));
      b_.copy_to_device(start, table_start_.data(), T * sizeof(int32_t));
      const int64_t max_pos = T > 0 ? *std::max_element(batch.positions.begin(), batch.positions.end()) : -1;
      ctx.tables = BlockTables{blocks, start, batch.blocks.data(), table_start_.data(), max_pos};
    }

    if (plan_.first_stage()) {
      // Vocabulary-parallel embedding: each rank fills the rows of the ids it owns, zeros elsewhere.
      local_ids_.resize(T);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t id = batch.tokens[t] - plan_.vocab0;
        local_ids_[t] = (id >= 0 && id < plan_.vocab) ? static_cast<int32_t>(id) : -1;
      }
      {
        OpSection s(b_, "embedding");
        b_.copy_to_device(ids, local_ids_.data(), T * sizeof(int32_t));
        if (T > 0) b_.embedding(ids, T, embed_, residual);
      }
      tp_sum(residual, T * H);
    } else if (received) {
      b_.copy_to_device(residual, scratch_.get(kStageInput, rows * H), T * H * sizeof(float));
    } else {
      comms_.pp->recv(residual, T * H, CommDType::kF32, plan_.stage - 1, kTagHidden);
    }
    run_layers(ctx, residual, h, proj);
    if (ctx.expert_tokens) expert_counter_.add_to(&moe_stats_.expert_tokens);
    sum_expert_tokens_over_tp();
  }

  // Tokens per expert routed from this engine group's batch: with expert parallelism each tp rank
  // routes its share of the tokens, so the shares are summed over tp. (Each group records its own,
  // so summing /steps rows counts every token once.)
  void sum_expert_tokens_over_tp() {
    if (comms_.ep && comms_.tp && spec_.moe.enabled()) {
      comms_.tp->all_reduce(moe_stats_.expert_tokens.data(), moe_stats_.expert_tokens.size(), CommDType::kI64,
                            ReduceOp::kSum);
    }
  }

  // Slot `slot` of n floats, with its bf16 twin in slot `twin` where the backend wants one.
  ActivationsOut normed_rows(int slot, int twin, size_t n) {
    return {scratch_.get(slot, n), b_.wants_bf16_twins() ? scratch_.get_as<uint16_t>(twin, n) : nullptr};
  }

  // The layers over the residual stream (embedded or received); it ends in `residual`.
  void run_layers(const StepContext& ctx, float* residual, ActivationsOut h, float* proj) {
    const int64_t T = ctx.T, H = spec_.hidden_size;
    const float eps = static_cast<float>(spec_.rms_norm_eps);
    for (size_t i = 0; i < layers_.size(); ++i) {
      Layer& layer = layers_[i];
      if (T > 0) {
        OpSection s(b_, "norm");
        if (i == 0)
          b_.rmsnorm(residual, layer.input_norm, T, eps, h);
        else
          b_.add_rmsnorm(residual, proj, layer.input_norm, T, eps, h);
      }
      StepContext layer_ctx = ctx;
      layer_ctx.kv_amax = kv_amax_.layer(i);
      layer.attn->forward(h, layer_ctx, cache_->layer(static_cast<int64_t>(i)), scratch_, proj);
      tp_sum(proj, T * H);
      if (T > 0) {
        OpSection s(b_, "norm");
        b_.add_rmsnorm(residual, proj, layer.post_attn_norm, T, eps, h);
      }
      layer.ffn->forward(h, ctx, scratch_, proj);
      tp_sum(proj, T * H);
    }
    if (T > 0) {
      OpSection s(b_, "norm");
      b_.add(residual, proj, T * H);
    }
  }

  // ---- Decode steps as captured graphs (--cuda-graphs; arch/step_graphs.h) ----

  // The device part of a graph step on this stage: what is captured. The residual stream ends in
  // slot 0; on the last stage the logits [B, vocab] end in slot 13.
  void graph_device_work(const StepContext& ctx) {
    const int64_t B = ctx.T, H = spec_.hidden_size;
    const float eps = static_cast<float>(spec_.rms_norm_eps);
    float* residual = scratch_.get(0, B * H);
    const ActivationsOut h = normed_rows(1, kHiddenTwin, B * H);
    float* proj = scratch_.get(2, B * H);
    if (plan_.first_stage()) {
      const int32_t* ids = scratch_.get_as<int32_t>(3, B);
      b_.embedding(ids, B, embed_, residual);
      tp_sum(residual, B * H);  // vocabulary-parallel embedding (see run_stage)
    } else {
      b_.copy_to_device(residual, scratch_.get(kStageInput, B * H), B * H * sizeof(float));
    }
    run_layers(ctx, residual, h, proj);
    if (!plan_.last_stage()) return;
    const ActivationsOut rows = normed_rows(12, kFinalRowsTwin, B * H);
    b_.rmsnorm(residual, final_norm_, B, eps, rows);
    b_.linear(rows, B, lm_head_, nullptr, scratch_.get(13, B * plan_.vocab));
  }

  // Replays (capturing first if need be) the step's bucket; on the last stage returns the logits,
  // [B, vocab] in backend memory (gathered over tp), of which the first T rows are the step's;
  // null on the others (the residual stream is in slot 0).
  const float* graph_step(const ForwardBatch& batch, int64_t B) {
    SHARDLM_CHECK(cache_, "forward before allocate_kv_cache");
    if (spec_.moe.enabled()) moe_stats_.reset(spec_.moe.num_experts);
    StepContext ctx = graphs_.upload_inputs(batch, B, *cache_, expert_counter_.device());
    ctx.ep_wire = ep_wire_;
    if (!plan_.first_stage()) {
      // The previous stage's hidden states of the T real rows; the padding rows keep whatever
      // the slot held (every op works row by row, and nothing reads them back).
      comms_.pp->recv(scratch_.get(kStageInput, B * spec_.hidden_size), batch.num_tokens() * spec_.hidden_size,
                      CommDType::kF32, plan_.stage - 1, kTagHidden);
    }
    const auto gather = [&] {
      if (comms_.tp && plan_.last_stage()) gather_vocab(scratch_.get(13, B * plan_.vocab), B);
    };
    const StepGraphs::Captured& step = [&]() -> const StepGraphs::Captured& {
      OpProfile::Pause pause(b_.op_profile());  // a capture puts no marks on the timeline
      return graphs_.ready(
          ctx, [&] { graph_device_work(ctx); }, gather, spec_.moe.enabled() ? &moe_stats_ : nullptr);
    }();
    expert_counter_.zero();  // the warm-up run counted its expert loads too: the step's are the replay's
    bool replayed = false;
    {
      OpSection s(b_, "graph replay");
      replayed = graphs_.replay(step, ctx);
    }
    if (!replayed) {
      // An ep block overflowed: the same decision on every rank of the ep group.
      run_stage(batch, /*received=*/true);
      return plan_.last_stage() ? logits_to_device(batch) : nullptr;
    }
    expert_counter_.add_to(&moe_stats_.expert_tokens);
    sum_expert_tokens_over_tp();
    if (spec_.moe.enabled()) {
      moe_stats_.dispatch_bytes = step.dispatch_bytes;
      moe_stats_.combine_bytes = step.combine_bytes;
      moe_stats_.dispatch_s = moe_stats_.combine_s = 0;  // inside the graph: not measured apart
    }
    if (!plan_.last_stage()) return nullptr;
    const float* local = scratch_.get(13, B * plan_.vocab);
    return comms_.tp ? gather_vocab(local, B) : local;
  }

  // The last stage: final norm and the vocabulary-parallel LM head on the rows that sample, then
  // the slices gathered over tp, into backend memory ([R, vocab], on every tp rank); null when no
  // row samples.
  const float* logits_to_device(const ForwardBatch& batch) {
    const int64_t T = batch.num_tokens(), H = spec_.hidden_size;
    const float eps = static_cast<float>(spec_.rms_norm_eps);
    float* residual = scratch_.get(0, T * H);
    // Only the rows that will be sampled go through the final norm and the LM head.
    const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
    if (R == 0) return nullptr;
    OpSection s(b_, "lm head", weight_bytes(lm_head_));
    const ActivationsOut rows = normed_rows(12, kFinalRowsTwin, R * H);
    int32_t* which = scratch_.get_as<int32_t>(8, R);
    b_.copy_to_device(which, batch.logit_rows.data(), R * sizeof(int32_t));
    b_.gather_rows(residual, H, which, R, rows.f32);  // one gather, not a copy per row
    b_.rmsnorm(rows.f32, final_norm_, R, eps, rows);
    float* local = scratch_.get(13, R * plan_.vocab);
    b_.linear(rows, R, lm_head_, nullptr, local);
    return comms_.tp ? gather_vocab(local, R) : local;
  }

  // Vocabulary-parallel head: the slices [R, V/tp] are all-gathered in backend memory (NCCL moves
  // them between GPUs) as [tp][R][V/tp] and interleaved into whole rows [R, V] by one row gather.
  const float* gather_vocab(const float* local, int64_t R) {
    const int64_t tp = plan_.tp_size, Vl = plan_.vocab;
    SHARDLM_CHECK(tp * Vl == spec_.vocab_size, "vocabulary slices of " << Vl << " x tp " << tp << " are not the "
                                                                        << spec_.vocab_size << " vocabulary");
    OpSection s(b_, "vocab gather");
    float* all = scratch_.get(14, tp * R * Vl);
    comms_.tp->all_gather(local, all, static_cast<size_t>(R * Vl), CommDType::kF32);
    vocab_order_.resize(static_cast<size_t>(tp * R));
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t s = 0; s < tp; ++s) vocab_order_[r * tp + s] = static_cast<int32_t>(s * R + r);
    }
    int32_t* order = scratch_.get_as<int32_t>(16, vocab_order_.size());
    b_.copy_to_device(order, vocab_order_.data(), vocab_order_.size() * sizeof(int32_t));
    float* whole = scratch_.get(15, R * spec_.vocab_size);
    b_.gather_rows(all, Vl, order, tp * R, whole);
    return whole;
  }

  // The last of several stages: the step's whole logits go back to the leader, or, for a step
  // with sample rows, the choices made here (tp rank 0 sends). graph_logits: the logits a graph
  // step computed (its first rows are the step's: every row samples), else null.
  void head(const ForwardBatch& batch, const float* graph_logits) {
    const float* dev = graph_logits ? graph_logits : logits_to_device(batch);
    // No row, no receive posted by the leader (an empty step an ep group replays has logits).
    if (!dev || plan_.tp_rank != 0 || batch.logit_rows.empty()) return;
    const int64_t R = static_cast<int64_t>(batch.logit_rows.size()), V = spec_.vocab_size;
    if (batch.sampled()) {
      OpSection s(b_, "sampling");
      step_choices_.sample(b_, dev, V, batch.sample_rows, batch.token_edits);
      pack_choices(step_choices_, &choices_);
      comms_.pp->send(choices_.data(), choices_.size(), CommDType::kI32, 0, kTagLogits);
      return;
    }
    host_logits_.resize(static_cast<size_t>(R * V));
    b_.copy_to_host(host_logits_.data(), dev, host_logits_.size() * sizeof(float));
    comms_.pp->send(host_logits_.data(), host_logits_.size(), CommDType::kF32, 0, kTagLogits);
  }

 private:
  struct InFlight {
    std::vector<float> logits;
    std::vector<int32_t> choices;  // a sampled step's (pack_choices)
    int64_t top = 0;               // ... and its top alternatives' count
    bool sampled = false;
    std::unique_ptr<CommRequest> recv;
    int64_t rows = 0;
    MoeStepStats moe;            // of this step's stage-0 MoE layers
    StageSeconds own;            // stage 0's part
    std::vector<int64_t> later;  // the later stages' figures (stage_figures_on), as received
    std::unique_ptr<CommRequest> figures_recv;
  };

  // Sums a row-parallel partial result over the tensor-parallel group; in a step being captured,
  // queued on the captured stream (see graph_step).
  void tp_sum(float* x, int64_t n) {
    if (!comms_.tp) return;
    OpSection s(b_, "tp all-reduce");
    if (graphs_.capturing())
      comms_.tp->enqueue_all_reduce(x, static_cast<size_t>(n), CommDType::kF32, ReduceOp::kSum, b_.current_stream());
    else
      comms_.tp->all_reduce(x, static_cast<size_t>(n), CommDType::kF32, ReduceOp::kSum);
  }

  ModelSpec spec_;
  ShardPlan plan_;
  MoeStepStats moe_stats_, last_moe_;  // the step being run; the step last ended (pipelined leader)
  std::vector<int64_t> figures_wire_;  // figures on their way between stages (stage_figures_on)
  ShardComms comms_;
  StageClock clock_;                       // this rank's part of each step
  std::vector<StageSeconds> last_stages_;  // the step last ended, per stage (the leader's: every stage's)
  ComputeBackend& b_;
  Scratch scratch_;
  StepGraphs graphs_;  // after scratch_, which it uses
  ExpertCounter expert_counter_;  // the step's expert loads (MoE models)
  std::vector<float> inv_freq_;
  float* inv_freq_dev_ = nullptr;
  std::unique_ptr<WeightLoader> weights_;
  Matrix embed_, lm_head_;
  Vector final_norm_;
  std::vector<Layer> layers_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> table_start_;
  std::vector<int32_t> local_ids_;
  std::vector<float> host_logits_;
  std::vector<int32_t> vocab_order_, choices_;
  StepChoices step_choices_;       // the last stage's, reused
  std::deque<InFlight> inflight_;  // the leader's begun pipeline steps, oldest first
  std::optional<DeviceStep> device_step_;  // the begun step, with logits_end_here()
  KvMagnitudes kv_amax_;                   // recording KV magnitudes (--kv-calibrate-out)
  ExpertWire ep_wire_ = ExpertWire::kF32;
  size_t load_bytes_ = 0;
  double load_seconds_ = 0;
};

}  // namespace

std::unique_ptr<Model> build_decoder(const ModelSpec& spec, const Checkpoint& ckpt, ComputeBackend& backend,
                                     const ShardPlan& plan, const ShardComms& comms) {
  return std::make_unique<Decoder>(spec, ckpt, backend, plan, comms);
}

}  // namespace shardlm
