// RecordingBackend: a test-only ComputeBackend that captures the way a CUDA graph does, on the CPU.
//
// It wraps a CpuBackend. Outside a capture every call goes straight to it. Between begin_capture
// and end_capture each op is recorded (a closure over its arguments: the pointers, sizes and
// weight handles it was issued with) and NOT executed, as a stream capture executes nothing; a
// replay runs the recording again, reading whatever the buffers hold by then. alloc, free,
// copy_to_host, sample and synchronize throw while recording, as the CUDA backend refuses them,
// so a model whose graph path passes here issues exactly the calls a CUDA capture accepts.
// copy_to_device is recorded (a captured memcpy).
//
// With set_twins(true) it asks for bf16 twins as the CUDA backend does (the CPU ops write them),
// and every linear given one checks, when it runs, that the twin is its rows' rounding: a twin
// left stale by a later write to its rows, or sized short, is counted (stale_twins).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "compute/backend.h"
#include "compute/cpu_backend.h"
#include "core/error.h"

namespace shardlm::test {

class RecordingBackend final : public ComputeBackend {
 public:
  std::string name() const override { return "recording-cpu"; }

  // Counters the tests check.
  int64_t captures() const { return captures_; }  // end_capture calls
  int64_t replays() const { return replays_; }
  int64_t drops() const { return drops_; }        // drop_captures calls that dropped something
  int64_t live_graphs() const { return static_cast<int64_t>(graphs_.size()); }
  bool recording() const { return recording_; }
  // Runs f now, or records it into the graph being captured (a communicator's queued collective).
  void record_or_run(std::function<void()> f) { op(std::move(f)); }
  // Linears that ran with a twin, and those whose twin was not their rows' rounding (set_twins).
  int64_t twin_linears() const { return twin_linears_; }
  int64_t stale_twins() const { return stale_twins_; }

  void set_twins(bool on) { twins_ = on; }
  bool wants_bf16_twins() const override { return twins_; }

  bool supports_capture() const override { return true; }
  void begin_capture() override {
    SHARDLM_CHECK(!recording_, "recording backend: begin_capture while recording");
    recording_ = true;
    current_.clear();
  }
  int64_t end_capture() override {
    SHARDLM_CHECK(recording_, "recording backend: end_capture without begin_capture");
    recording_ = false;
    ++captures_;
    graphs_[next_] = std::move(current_);
    current_.clear();
    return next_++;
  }
  void replay(int64_t handle) override {
    SHARDLM_CHECK(!recording_, "recording backend: replay while recording");
    auto it = graphs_.find(handle);
    SHARDLM_CHECK(it != graphs_.end(), "recording backend: replay of unknown graph " << handle);
    ++replays_;
    for (const auto& op : it->second) op();
  }
  void drop_captures() override {
    SHARDLM_CHECK(!recording_, "recording backend: drop_captures while recording");
    if (!graphs_.empty()) ++drops_;
    graphs_.clear();
  }

  Matrix load_matrix(const TensorView& t) override { return cpu_.load_matrix(t); }
  Vector load_vector(const TensorView& t) override { return cpu_.load_vector(t); }

  // Freed buffers are poisoned and kept until the backend goes: a graph replayed after the
  // buffers it was captured with were freed (a missed recapture) reads garbage and writes where
  // nothing reads, so its results are wrong, not silently right.
  void* alloc(size_t bytes) override {
    refuse("alloc");
    void* p = cpu_.alloc(bytes);
    sizes_[p] = bytes;
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    refuse("free");
    auto it = sizes_.find(p);
    SHARDLM_CHECK(it != sizes_.end(), "recording backend: free of a pointer not from alloc()");
    std::memset(p, 0xff, it->second);
    sizes_.erase(it);
    freed_.push_back(p);
  }
  ~RecordingBackend() override {
    for (void* p : freed_) cpu_.free(p);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    op([=, this] { cpu_.copy_to_device(dst, src, bytes); });
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    refuse("copy_to_host");
    cpu_.copy_to_host(dst, src, bytes);
  }
  void synchronize() override { refuse("synchronize"); }
  // A stream capture takes no timed events: the op profile must pause around captures.
  int64_t mark_timeline() override {
    refuse("mark_timeline");
    return ComputeBackend::mark_timeline();
  }
  // Reads backend memory and writes host memory, as copy_to_host: never recorded, refused while
  // capturing; called after a replay it reads what the replayed ops wrote.
  void sample(const float* logits, int64_t R, int64_t V, const SampleRow* rows, const TokenEdit* seen, int32_t* tokens,
              float* logprobs, int32_t* top_tokens, float* top_logprobs) override {
    refuse("sample");
    cpu_.sample(logits, R, V, rows, seen, tokens, logprobs, top_tokens, top_logprobs);
  }

  void embedding(const int32_t* ids, int64_t T, const Matrix& table, float* out) override {
    op([=, this] { cpu_.embedding(ids, T, table, out); });
  }
  void rmsnorm(const float* x, const Vector& w, int64_t rows, float eps, ActivationsOut out) override {
    op([=, this] { cpu_.rmsnorm(x, w, rows, eps, out); });
  }
  void add_rmsnorm(float* residual, const float* x, const Vector& w, int64_t rows, float eps,
                   ActivationsOut out) override {
    op([=, this] { cpu_.add_rmsnorm(residual, x, w, rows, eps, out); });
  }
  void linear(Activations x, int64_t M, const Matrix& w, const Vector* bias, float* y) override {
    op([=, this] {
      check_twin(x, M * w.cols);
      cpu_.linear(x, M, w, bias, y);
    });
  }
  void linear_parts(Activations x, int64_t M, std::span<const LinearPart> parts) override {
    std::vector<LinearPart> p(parts.begin(), parts.end());  // the caller's array is gone at replay
    op([=, this] {
      check_twin(x, M * p[0].w->cols);
      cpu_.linear_parts(x, M, p);
    });
  }
  void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
            const float* inv_freq) override {
    op([=, this] { cpu_.rope(x, T, n_heads, head_dim, pos, inv_freq); });
  }
  void rope_qk(float* q, int64_t q_heads, float* k, int64_t k_heads, int64_t T, int64_t head_dim, const int32_t* pos,
               const float* inv_freq) override {
    op([=, this] { cpu_.rope_qk(q, q_heads, k, k_heads, T, head_dim, pos, inv_freq); });
  }
  void silu_mul(const float* gate, const float* up, ActivationsOut out, int64_t n) override {
    op([=, this] { cpu_.silu_mul(gate, up, out, n); });
  }
  void add(float* y, const float* x, int64_t n) override {
    op([=, this] { cpu_.add(y, x, n); });
  }
  void kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads, int64_t head_dim,
                int64_t block_size, const KvCacheRef& cache) override {
    op([=, this] { cpu_.kv_write(k, v, T, slots, n_kv_heads, head_dim, block_size, cache); });
  }
  void attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                 const KvCacheRef& cache, int64_t block_size, const BlockTables& tables, const int32_t* pos,
                 int64_t window, float scale, ActivationsOut out) override {
    // A recorded op may not use the host copies of the block tables: they belong to one step.
    if (recording_) {
      SHARDLM_CHECK(!tables.host_blocks && !tables.host_start,
                    "recording backend: attention captured with host block tables");
    }
    op([=, this] {
      cpu_.attention(q, T, n_heads, n_kv_heads, head_dim, cache, block_size, tables, pos, window, scale, out);
    });
  }
  void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                    int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                    float attention_factor, float* out) override {
    op([=, this] {
      cpu_.rope_strided(x, T, n_heads, x_stride, head_stride, rot_dim, pos, inv_freq, interleaved, attention_factor,
                        out);
    });
  }
  void head_linear(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, const Matrix& w,
                   ActivationsOut y) override {
    op([=, this] { cpu_.head_linear(x, T, n_heads, x_stride, head_stride, w, y); });
  }
  void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                          int64_t rope_dim, const KvCacheRef& cache) override {
    op([=, this] { cpu_.latent_cache_write(latent, k_rope, T, slots, kv_lora, rope_dim, cache); });
  }
  void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                        int64_t rope_dim, const KvCacheRef& cache, int64_t block_size, const BlockTables& tables,
                        const int32_t* pos, float scale, float* out) override {
    if (recording_) {
      SHARDLM_CHECK(!tables.host_blocks && !tables.host_start,
                    "recording backend: latent_attention captured with host block tables");
    }
    op([=, this] {
      cpu_.latent_attention(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, cache, block_size, tables, pos, scale,
                            out);
    });
  }
  void moe_route(const float* logits, int64_t T, const RouterConfig& cfg, int32_t* ids, float* weights) override {
    op([=, this] { cpu_.moe_route(logits, T, cfg, ids, weights); });
  }
  void expert_permute(const int32_t* ids, int64_t T, int64_t k, int64_t e0, int64_t E, const int32_t* pos,
                      int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts) override {
    op([=, this] { cpu_.expert_permute(ids, T, k, e0, E, pos, offsets, slot_row, row_pair, counts); });
  }
  void expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* num_rows,
                     int64_t max_rows, ActivationsOut xp) override {
    op([=, this] { cpu_.expert_gather(x, H, k, row_pair, num_rows, max_rows, xp); });
  }
  // The groups are read when the op runs (at each replay), as a device kernel reads them; so is
  // the twin, over the groups' rows (those past them are not read).
  using ComputeBackend::grouped_linear_routed;
  void grouped_linear_routed(Activations x, int64_t max_rows, int64_t expect_rows, const int32_t* offsets,
                             const std::vector<const Matrix*>& w, float* y) override {
    op([=, this] {
      check_twin(x, offsets[w.size()] * w[0]->cols);
      cpu_.grouped_linear_routed(x, max_rows, expect_rows, offsets, w, y);
    });
  }
  void expert_combine(const float* yp, int64_t H, const int32_t* ids, const float* weights, const int32_t* slot_row,
                      int64_t T, int64_t k, float* out) override {
    op([=, this] { cpu_.expert_combine(yp, H, ids, weights, slot_row, T, k, out); });
  }
  void expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* ids, const float* weights,
                           const int32_t* slot_row, int64_t T, int64_t k, float* out) override {
    op([=, this] { cpu_.expert_combine_bf16(yp, H, ids, weights, slot_row, T, k, out); });
  }
  void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) override {
    op([=, this] { cpu_.gated_add(out, y, gate_logits, T, H); });
  }
  void abs_max(const float* x, int64_t n, float* acc) override {
    op([=, this] { cpu_.abs_max(x, n, acc); });
  }
  void expert_send_plan(const cpu::ExchangeShape& s, const int32_t* ids, int64_t T, cpu::RowShare share,
                        const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row, int64_t* counts,
                        int32_t* overflow) override {
    op([=, this] { cpu_.expert_send_plan(s, ids, T, share, pos, rec_token, blocks, pair_row, counts, overflow); });
  }
  void expert_recv_plan(const cpu::ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                        int32_t* back_row) override {
    op([=, this] { cpu_.expert_recv_plan(s, blocks, offsets, row_src, back_row); });
  }
  void pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) override {
    op([=, this] { cpu_.pack_bf16(src, blocks, block_len, round_len, dst); });
  }
  void unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst) override {
    op([=, this] { cpu_.unpack_bf16(src, blocks, block_len, round_len, dst); });
  }
  void pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                uint8_t* dst) override {
    op([=, this] { cpu_.pack_fp8(src, blocks, block_len, round_len, row_len, dst); });
  }
  void unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                  float* dst) override {
    op([=, this] { cpu_.unpack_fp8(src, blocks, block_len, round_len, row_len, dst); });
  }
  void gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override {
    op([=, this] { cpu_.gather_rows(src, H, rows, n, dst); });
  }
  void combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows, const float* weights,
                    int64_t T, float* out) override {
    op([=, this] { cpu_.combine_rows(y, H, token_start, rows, weights, T, out); });
  }
  void pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst) override {
    op([=, this] { cpu_.pack_rows_bf16(src, H, rows, n, dst); });
  }
  void unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override {
    op([=, this] { cpu_.unpack_rows_bf16(src, H, rows, n, dst); });
  }
  void pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst) override {
    op([=, this] { cpu_.pack_rows_fp8(src, H, rows, n, dst); });
  }
  void unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override {
    op([=, this] { cpu_.unpack_rows_fp8(src, H, rows, n, dst); });
  }
  void combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                         const float* weights, int64_t T, float* out) override {
    op([=, this] { cpu_.combine_rows_bf16(y, H, token_start, rows, weights, T, out); });
  }

 private:
  template <typename F>
  void op(F&& f) {
    if (recording_)
      current_.emplace_back(std::forward<F>(f));
    else
      f();
  }
  void refuse(const char* what) const {
    SHARDLM_CHECK(!recording_, "recording backend: " << what << " while capturing (a CUDA capture refuses it)");
  }
  void check_twin(Activations x, int64_t n) {
    if (!x.bf16) return;
    ++twin_linears_;
    for (int64_t i = 0; i < n; ++i) {
      if (x.bf16[i] != f32_to_bf16(x.f32[i])) {
        ++stale_twins_;
        return;
      }
    }
  }

  CpuBackend cpu_;
  std::map<void*, size_t> sizes_;
  std::vector<void*> freed_;
  bool recording_ = false;
  std::vector<std::function<void()>> current_;
  std::map<int64_t, std::vector<std::function<void()>>> graphs_;
  int64_t next_ = 0, captures_ = 0, replays_ = 0, drops_ = 0;
  bool twins_ = false;
  int64_t twin_linears_ = 0, stale_twins_ = 0;
};

}  // namespace shardlm::test
