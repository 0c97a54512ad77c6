// CpuBackend: ComputeBackend on host memory, running the kernels in kernels/cpu.
//
// F32 / BF16 matrices are used in place (zero-copy views of the mapped checkpoint); F16 matrices
// are converted to an fp32 copy owned by the backend. Vectors are always fp32 copies.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "compute/backend.h"
#include "engine/sampler.h"

namespace shardlm {

class CpuBackend : public ComputeBackend {
 public:
  CpuBackend() = default;
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string name() const override { return "cpu"; }

  Matrix load_matrix(const TensorView& t) override;
  Vector load_vector(const TensorView& t) override;

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;

  void embedding(const int32_t* ids, int64_t T, const Matrix& table, float* out) override;
  void rmsnorm(const float* x, const Vector& w, int64_t rows, float eps, ActivationsOut out) override;
  void add_rmsnorm(float* residual, const float* x, const Vector& w, int64_t rows, float eps,
                   ActivationsOut out) override;
  void linear(Activations x, int64_t M, const Matrix& w, const Vector* bias, float* y) override;
  // cpu::matmul_parts_*: all parts in one parallel region, each element bit for bit linear()'s.
  void linear_parts(Activations x, int64_t M, std::span<const LinearPart> parts) override;
  // cpu::grouped_matmul_*: all groups in one parallel region, each element bit for bit linear()'s.
  // A call takes up to kGroupedRows rows, so the rows of gate and up stay in cache between GEMMs.
  void grouped_linear(Activations x, const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w,
                      float* y) override;
  std::string grouped_linear_path() const override { return "one parallel region for all groups (cpu)"; }
  int64_t grouped_linear_rows() const override { return kGroupedRows; }
  static constexpr int64_t kGroupedRows = 1024;
  void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
            const float* inv_freq) override;
  void silu_mul(const float* gate, const float* up, ActivationsOut out, int64_t n) override;
  void silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, ActivationsOut out) override;
  void add(float* y, const float* x, int64_t n) override;
  void kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                int64_t head_dim, int64_t block_size, const KvCacheRef& cache) override;
  void attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                 const KvCacheRef& cache, int64_t block_size, const BlockTables& tables, const int32_t* pos,
                 int64_t window, float scale, ActivationsOut out) override;
  void rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                    int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                    float attention_factor, float* out) override;
  void head_linear(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride, const Matrix& w,
                   ActivationsOut y) override;
  void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots,
                          int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache) override;
  void latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads, int64_t kv_lora,
                        int64_t rope_dim, const KvCacheRef& cache, int64_t block_size,
                        const BlockTables& tables, const int32_t* pos, float scale, float* out) override;
  // Mixture-of-Experts: the host router (arch/moe_router.h) and kernels/cpu/expert_permute.h,
  // gated_add.h, so that a block running through these ops matches the host path bit for bit.
  void moe_route(const float* logits, int64_t T, const RouterConfig& cfg, int32_t* ids, float* weights) override;
  void expert_permute(const int32_t* ids, int64_t T, int64_t k, int64_t e0, int64_t E, const int32_t* pos,
                      int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts) override;
  void expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* num_rows,
                     int64_t max_rows, ActivationsOut xp) override;
  void expert_combine(const float* yp, int64_t H, const int32_t* ids, const float* weights, const int32_t* slot_row,
                      int64_t T, int64_t k, float* out) override;
  void expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* ids, const float* weights,
                           const int32_t* slot_row, int64_t T, int64_t k, float* out) override;
  void gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) override;
  void abs_max(const float* x, int64_t n, float* acc) override;
  // Expert-parallel data movement: kernels/cpu/expert_rows.h. Ops run to completion, so
  // synchronize() has nothing to wait for.
  void gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override;
  void pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) override;
  void unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst) override;
  void pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                uint8_t* dst) override;
  void unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                  float* dst) override;
  void expert_send_plan(const cpu::ExchangeShape& s, const int32_t* ids, int64_t T, cpu::RowShare share,
                        const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row, int64_t* counts,
                        int32_t* overflow) override;
  void expert_recv_plan(const cpu::ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                        int32_t* back_row) override;
  void pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst) override;
  void unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override;
  void pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst) override;
  void unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) override;
  void combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                         const float* weights, int64_t T, float* out) override;
  void combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows, const float* weights,
                    int64_t T, float* out) override;
  // The host Sampler on each row: the engine's choice before sampling moved behind the backend.
  void sample(const float* logits, int64_t R, int64_t V, const SampleRow* rows, const TokenEdit* edits, int32_t* tokens,
              float* logprobs, int32_t* top_tokens, float* top_logprobs) override;
  void synchronize() override {}

 private:
  float* alloc_floats(size_t n);  // owned weight storage (converted copies)
  // The CPU kernels take one block-list pointer per token.
  const int32_t* const* token_tables(const BlockTables& tables, int64_t T);
  std::vector<const int32_t*> token_tables_;
  std::vector<Sampler> samplers_;  // sample(): one per thread
  std::vector<const uint16_t*> grouped_bf16_;  // grouped_linear's weight pointers
  std::vector<const float*> grouped_f32_;

  std::mutex mu_;
  std::unordered_set<void*> allocs_;  // activation memory from alloc()
  std::vector<void*> owned_;          // weight copies, freed in the destructor
};

std::unique_ptr<ComputeBackend> make_cpu_backend();

}  // namespace shardlm
