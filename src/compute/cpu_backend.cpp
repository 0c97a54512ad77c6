#include "compute/cpu_backend.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <type_traits>
#include <vector>

#include "arch/moe_router.h"
#include "core/error.h"
#include "cpu/activation.h"
#include "cpu/embedding.h"
#include "cpu/expert_permute.h"
#include "cpu/expert_rows.h"
#include "cpu/wire_bf16.h"
#include "cpu/wire_fp8.h"
#include "cpu/abs_max.h"
#include "cpu/gated_add.h"
#include "cpu/head_matmul.h"
#include "cpu/latent_attention.h"
#include "cpu/matmul.h"
#include "cpu/paged_attention.h"
#include "cpu/rmsnorm.h"
#include "cpu/rope.h"
#include "cpu/rope_strided.h"
#include "cpu/threads.h"
#include "model/checkpoint.h"

namespace shardlm {
namespace {

KvFormat cache_format(const KvCacheRef& cache) {
  if (cache.dtype == DType::BF16) return KvFormat(KvElem::BF16);
  if (cache.dtype == DType::F8_E4M3) return KvFormat(KvElem::FP8, cache.k_scale, cache.v_scale);
  SHARDLM_CHECK(cache.dtype == DType::F32,
                "cpu backend: a KV cache of " << dtype_name(cache.dtype) << " (F32, BF16 and F8_E4M3 are kept)");
  return KvFormat(KvElem::F32);
}

// Buffers from 4 MiB up (weights, the KV cache, large activations) are 2 MiB-aligned and asked to
// be backed by transparent huge pages: attention walks the KV cache a row of one head at a time,
// a 4 KiB page holding as few as two positions, and with 4 KiB pages that walk misses the TLB at
// nearly every other row (huge pages took shardlm bench's 32k-position decode attention from
// 19-22 to 15-18 ms here).
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeFrom = size_t{4} << 20;

void* aligned64(size_t bytes) {
  const size_t align = bytes >= kHugeFrom ? kHugePage : 64;
  const size_t n = ((bytes == 0 ? 1 : bytes) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, n);
  SHARDLM_CHECK(p != nullptr, "cpu backend: out of memory allocating " << bytes << " bytes");
#ifdef MADV_HUGEPAGE
  if (align == kHugePage) madvise(p, n, MADV_HUGEPAGE);  // advice only: without THP nothing changes
#endif
  return p;
}

// fp32 copy of n elements of a tensor in F32, BF16 or F16.
void convert_to_f32(const TensorView& t, int64_t n, float* out) {
  switch (t.dtype) {
    case DType::F32:
      std::memcpy(out, t.data, n * sizeof(float));
      return;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(s[i]);
      return;
    }
    default:
      SHARDLM_FAIL("cpu backend: tensor '" << t.name << "' in " << t.file << " has dtype " << dtype_name(t.dtype)
                                           << "; expected F32, BF16 or F16");
  }
}

}  // namespace

CpuBackend::~CpuBackend() {
  for (void* p : allocs_) std::free(p);
  for (void* p : owned_) std::free(p);
}

float* CpuBackend::alloc_floats(size_t n) {
  float* p = static_cast<float*>(aligned64(n * sizeof(float)));
  std::lock_guard<std::mutex> lock(mu_);
  owned_.push_back(p);
  return p;
}

Matrix CpuBackend::load_matrix(const TensorView& t) {
  SHARDLM_CHECK(t.shape.size() == 2, "cpu backend: tensor '" << t.name << "' in " << t.file << " has " << t.shape.size()
                                                             << " dimensions; a matrix needs 2");
  SHARDLM_CHECK(t.data != nullptr || t.numel() == 0,
                "cpu backend: tensor '" << t.name << "' in " << t.file << " has no data");
  Matrix m;
  m.rows = t.shape[0];
  m.cols = t.shape[1];
  switch (t.dtype) {
    case DType::F32:
    case DType::BF16:
      m.dtype = t.dtype;
      m.data = t.data;  // zero-copy view of the mapped checkpoint
      return m;
    case DType::F16: {
      float* p = alloc_floats(static_cast<size_t>(t.numel()));
      convert_to_f32(t, t.numel(), p);
      m.dtype = DType::F32;
      m.data = p;
      return m;
    }
    default:
      SHARDLM_FAIL("cpu backend: matrix '" << t.name << "' in " << t.file << " has dtype " << dtype_name(t.dtype)
                                           << "; expected F32, BF16 or F16");
  }
}

Vector CpuBackend::load_vector(const TensorView& t) {
  SHARDLM_CHECK(t.shape.size() == 1, "cpu backend: tensor '" << t.name << "' in " << t.file << " has " << t.shape.size()
                                                             << " dimensions; a vector needs 1");
  Vector v;
  v.n = t.shape[0];
  float* p = alloc_floats(static_cast<size_t>(v.n));
  convert_to_f32(t, v.n, p);
  v.data = p;
  return v;
}

void* CpuBackend::alloc(size_t bytes) {
  void* p = aligned64(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  allocs_.insert(p);
  return p;
}

void CpuBackend::free(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocs_.find(p);
    SHARDLM_CHECK(it != allocs_.end(), "cpu backend: free() of a pointer not from alloc()");
    allocs_.erase(it);
  }
  std::free(p);
}

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::embedding(const int32_t* ids, int64_t T, const Matrix& table, float* out) {
  if (table.dtype == DType::BF16)
    cpu::embedding_bf16(ids, T, static_cast<const uint16_t*>(table.data), table.cols, out);
  else
    cpu::embedding_f32(ids, T, static_cast<const float*>(table.data), table.cols, out);
}

namespace {

// The CPU's GEMMs read fp32 activations, so no caller here asks for a twin; one asked for is
// written all the same, as the interface promises.
void write_twin(ActivationsOut out, int64_t n) {
  if (!out.bf16) return;
  for (int64_t i = 0; i < n; ++i) out.bf16[i] = f32_to_bf16(out.f32[i]);
}

// The twins of rows [n, H] but for those marked kKeepRow, which keep theirs.
void write_row_twins(ActivationsOut out, int64_t H, const int32_t* rows, int64_t n) {
  if (!out.bf16) return;
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] != cpu::kKeepRow) write_twin({out.f32 + i * H, out.bf16 + i * H}, H);
}

}  // namespace

void CpuBackend::rmsnorm(const float* x, const Vector& w, int64_t rows, float eps, ActivationsOut out) {
  cpu::rmsnorm(x, w.data, rows, w.n, eps, out.f32);
  write_twin(out, rows * w.n);
}

void CpuBackend::add_rmsnorm(float* residual, const float* x, const Vector& w, int64_t rows, float eps,
                             ActivationsOut out) {
  cpu::add_rmsnorm(residual, x, w.data, rows, w.n, eps, out.f32);
  write_twin(out, rows * w.n);
}

void CpuBackend::linear(Activations in, int64_t M, const Matrix& w, const Vector* bias, float* y) {
  const float* b = nullptr;
  if (bias && bias->data) {
    SHARDLM_CHECK(bias->n == w.rows, "cpu backend: linear bias has " << bias->n << " elements; weight has "
                                                                       << w.rows << " rows");
    b = bias->data;
  }
  const float* x = in.f32;
  if (w.dtype == DType::BF16)
    cpu::matmul_bf16w(x, M, w.cols, static_cast<const uint16_t*>(w.data), w.rows, b, y);
  else if (w.dtype == DType::F32)
    cpu::matmul_f32w(x, M, w.cols, static_cast<const float*>(w.data), w.rows, b, y);
  else
    SHARDLM_FAIL("cpu backend: linear weight dtype " << dtype_name(w.dtype) << " is not F32 or BF16");
}

namespace {

template <typename WT>
void run_matmul_parts(const float* x, int64_t M, std::span<const LinearPart> parts) {
  // On the stack for a layer's few parts: a decode step of a small model is tens of microseconds.
  constexpr size_t kOnStack = 8;
  std::array<cpu::MatmulPart<WT>, kOnStack> on_stack;
  std::vector<cpu::MatmulPart<WT>> on_heap(parts.size() > kOnStack ? parts.size() : 0);
  cpu::MatmulPart<WT>* mp = parts.size() > kOnStack ? on_heap.data() : on_stack.data();
  for (size_t i = 0; i < parts.size(); ++i) {
    const LinearPart& p = parts[i];
    mp[i] = {static_cast<const WT*>(p.w->data), p.w->rows, p.bias && p.bias->data ? p.bias->data : nullptr, p.y};
  }
  const int64_t K = parts[0].w->cols, n = static_cast<int64_t>(parts.size());
  if constexpr (std::is_same_v<WT, float>)
    cpu::matmul_parts_f32w(x, M, K, mp, n);
  else
    cpu::matmul_parts_bf16w(x, M, K, mp, n);
}

}  // namespace

void CpuBackend::linear_parts(Activations x, int64_t M, std::span<const LinearPart> parts) {
  check_linear_parts(parts, "cpu backend");
  const DType dt = parts[0].w->dtype;
  bool one_dtype = dt == DType::BF16 || dt == DType::F32;
  for (const LinearPart& p : parts) one_dtype = one_dtype && p.w->dtype == dt;
  if (!one_dtype) return ComputeBackend::linear_parts(x, M, parts);
  if (dt == DType::BF16)
    run_matmul_parts<uint16_t>(x.f32, M, parts);
  else
    run_matmul_parts<float>(x.f32, M, parts);
}

void CpuBackend::grouped_linear(Activations x, const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w,
                                float* y) {
  check_grouped_linear(offsets, w, "cpu backend");
  const int64_t G = static_cast<int64_t>(w.size());
  if (G == 0) return;
  const DType dt = w[0]->dtype;
  bool one_dtype = dt == DType::BF16 || dt == DType::F32;
  for (const Matrix* m : w) one_dtype = one_dtype && m->dtype == dt;
  if (!one_dtype) return ComputeBackend::grouped_linear(x, offsets, w, y);
  const int64_t N = w[0]->rows, K = w[0]->cols;
  if (dt == DType::BF16) {
    grouped_bf16_.clear();
    for (const Matrix* m : w) grouped_bf16_.push_back(static_cast<const uint16_t*>(m->data));
    cpu::grouped_matmul_bf16w(x.f32, offsets.data(), G, K, grouped_bf16_.data(), N, y);
  } else {
    grouped_f32_.clear();
    for (const Matrix* m : w) grouped_f32_.push_back(static_cast<const float*>(m->data));
    cpu::grouped_matmul_f32w(x.f32, offsets.data(), G, K, grouped_f32_.data(), N, y);
  }
}

void CpuBackend::rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                      const float* inv_freq) {
  cpu::rope_rotate_half(x, T, n_heads, head_dim, pos, inv_freq);
}

void CpuBackend::silu_mul(const float* gate, const float* up, ActivationsOut out, int64_t n) {
  cpu::silu_mul(gate, up, out.f32, n);
  write_twin(out, n);
}

void CpuBackend::silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, ActivationsOut out) {
  cpu::silu_mul_stacked(gate_up, rows, width, out.f32);
  write_twin(out, rows * width);
}

void CpuBackend::add(float* y, const float* x, int64_t n) { cpu::add_inplace(y, x, n); }

void CpuBackend::kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                          int64_t head_dim, int64_t block_size, const KvCacheRef& cache) {
  cpu::kv_cache_write(k, v, T, slots, n_kv_heads, head_dim, block_size, cache.k, cache.v, cache_format(cache));
}

void CpuBackend::attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                           const KvCacheRef& cache, int64_t block_size, const BlockTables& tables, const int32_t* pos,
                           int64_t window, float scale, ActivationsOut out) {
  SHARDLM_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "cpu backend: n_heads " << n_heads << " is not a multiple of n_kv_heads " << n_kv_heads);
  cpu::paged_attention(q, T, n_heads, n_kv_heads, head_dim, cache.k, cache.v, cache_format(cache), block_size,
                       token_tables(tables, T), pos, window, scale, out.f32);
  write_twin(out, T * n_heads * head_dim);
}

void CpuBackend::rope_strided(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                              int64_t rot_dim, const int32_t* pos, const float* inv_freq, bool interleaved,
                              float attention_factor, float* out) {
  SHARDLM_CHECK(rot_dim % 2 == 0, "cpu backend: rope_strided rot_dim " << rot_dim << " is odd");
  cpu::rope_strided(x, T, n_heads, x_stride, head_stride, rot_dim, pos, inv_freq, interleaved, attention_factor,
                    out);
}

void CpuBackend::head_linear(const float* x, int64_t T, int64_t n_heads, int64_t x_stride, int64_t head_stride,
                             const Matrix& w, ActivationsOut y) {
  SHARDLM_CHECK(n_heads > 0 && w.rows % n_heads == 0,
                "cpu backend: head_linear weight has " << w.rows << " rows, not a multiple of " << n_heads << " heads");
  const int64_t N = w.rows / n_heads;
  if (w.dtype == DType::BF16)
    cpu::head_matmul_bf16w(x, T, n_heads, x_stride, head_stride, w.cols, static_cast<const uint16_t*>(w.data), N,
                           y.f32);
  else if (w.dtype == DType::F32)
    cpu::head_matmul_f32w(x, T, n_heads, x_stride, head_stride, w.cols, static_cast<const float*>(w.data), N, y.f32);
  else
    SHARDLM_FAIL("cpu backend: head_linear weight dtype " << dtype_name(w.dtype) << " is not F32 or BF16");
  write_twin(y, T * n_heads * N);
}

void CpuBackend::latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots,
                                    int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache) {
  cpu::latent_cache_write(latent, k_rope, T, slots, kv_lora, rope_dim, cache.k, cache_format(cache));
}

void CpuBackend::latent_attention(const float* q_latent, const float* q_rope, int64_t T, int64_t n_heads,
                                  int64_t kv_lora, int64_t rope_dim, const KvCacheRef& cache, int64_t block_size,
                                  const BlockTables& tables, const int32_t* pos, float scale, float* out) {
  cpu::latent_attention(q_latent, q_rope, T, n_heads, kv_lora, rope_dim, cache.k, cache_format(cache), block_size,
                        token_tables(tables, T), pos, scale, out);
}

void CpuBackend::moe_route(const float* logits, int64_t T, const RouterConfig& cfg, int32_t* ids, float* weights) {
  // The host router itself, so that both paths of the MoE block route identically.
  Routing r;
  if (cfg.sigmoid)
    route_sigmoid_grouped(logits, T, cfg.num_experts, cfg.k, cfg.bias, cfg.n_group, cfg.topk_group,
                          cfg.norm_topk_prob, cfg.scale, &r);
  else
    route_softmax_topk(logits, T, cfg.num_experts, cfg.k, cfg.renormalise, cfg.scale, &r);
  if (T == 0) return;
  std::memcpy(ids, r.experts.data(), r.experts.size() * sizeof(int32_t));
  std::memcpy(weights, r.weights.data(), r.weights.size() * sizeof(float));
}

void CpuBackend::expert_permute(const int32_t* ids, int64_t T, int64_t k, int64_t e0, int64_t E, const int32_t* pos,
                                int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts) {
  SHARDLM_CHECK(E >= 0 && e0 >= 0 && e0 + E <= INT32_MAX && T >= 0 && k >= 0 && T * k <= INT32_MAX,
                "cpu backend: expert_permute of " << T << " x " << k << " slots over experts [" << e0 << ", +" << E
                                                  << ")");
  cpu::expert_permute(ids, T, k, static_cast<int32_t>(e0), E, pos, offsets, slot_row, row_pair, counts);
}

void CpuBackend::expert_gather(const float* x, int64_t H, int64_t k, const int32_t* row_pair, const int32_t* num_rows,
                               int64_t max_rows, ActivationsOut xp) {
  cpu::expert_gather(x, H, k, row_pair, num_rows, max_rows, xp.f32);
  write_twin(xp, std::min<int64_t>(*num_rows, max_rows) * H);
}

void CpuBackend::expert_combine(const float* yp, int64_t H, const int32_t* ids, const float* weights,
                                const int32_t* slot_row, int64_t T, int64_t k, float* out) {
  cpu::expert_combine(yp, H, ids, weights, slot_row, T, k, out);
}

void CpuBackend::expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* ids, const float* weights,
                                     const int32_t* slot_row, int64_t T, int64_t k, float* out) {
  cpu::expert_combine_bf16(yp, H, ids, weights, slot_row, T, k, out);
}

void CpuBackend::gated_add(float* out, const float* y, const float* gate_logits, int64_t T, int64_t H) {
  cpu::gated_add(out, y, gate_logits, T, H);
}

void CpuBackend::abs_max(const float* x, int64_t n, float* acc) { cpu::abs_max(x, n, acc); }

void CpuBackend::expert_send_plan(const cpu::ExchangeShape& s, const int32_t* ids, int64_t T, cpu::RowShare share,
                                  const int32_t* pos, int32_t* rec_token, float* blocks, int32_t* pair_row,
                                  int64_t* counts, int32_t* overflow) {
  cpu::expert_send_plan(s, ids, T, share, pos, rec_token, blocks, pair_row, counts, overflow);
}

void CpuBackend::expert_recv_plan(const cpu::ExchangeShape& s, const float* blocks, int32_t* offsets, int32_t* row_src,
                                  int32_t* back_row) {
  cpu::expert_recv_plan(s, blocks, offsets, row_src, back_row);
}

void CpuBackend::gather_rows(const float* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) {
  cpu::gather_rows(src, H, rows, n, dst.f32);
  write_row_twins(dst, H, rows, n);
}

void CpuBackend::pack_bf16(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, uint16_t* dst) {
  cpu::pack_bf16(src, blocks, block_len, round_len, dst);
}

void CpuBackend::unpack_bf16(const uint16_t* src, int64_t blocks, int64_t block_len, int64_t round_len, float* dst) {
  cpu::unpack_bf16(src, blocks, block_len, round_len, dst);
}

void CpuBackend::pack_fp8(const float* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                          uint8_t* dst) {
  cpu::pack_fp8(src, blocks, block_len, round_len, row_len, dst);
}

void CpuBackend::unpack_fp8(const uint8_t* src, int64_t blocks, int64_t block_len, int64_t round_len, int64_t row_len,
                            float* dst) {
  cpu::unpack_fp8(src, blocks, block_len, round_len, row_len, dst);
}

void CpuBackend::combine_rows(const float* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                              const float* weights, int64_t T, float* out) {
  cpu::combine_rows(y, H, token_start, rows, weights, T, out);
}

void CpuBackend::pack_rows_bf16(const float* src, int64_t H, const int32_t* rows, int64_t n, uint16_t* dst) {
  cpu::pack_rows_bf16(src, H, rows, n, dst);
}

void CpuBackend::unpack_rows_bf16(const uint16_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) {
  cpu::unpack_rows_bf16(src, H, rows, n, dst.f32);
  write_twin(dst, n * H);
}

void CpuBackend::pack_rows_fp8(const float* src, int64_t H, const int32_t* rows, int64_t n, uint8_t* dst) {
  cpu::pack_rows_fp8(src, H, rows, n, dst);
}

void CpuBackend::unpack_rows_fp8(const uint8_t* src, int64_t H, const int32_t* rows, int64_t n, ActivationsOut dst) {
  cpu::unpack_rows_fp8(src, H, rows, n, dst.f32);
  write_twin(dst, n * H);
}

void CpuBackend::combine_rows_bf16(const uint16_t* y, int64_t H, const int32_t* token_start, const int32_t* rows,
                                   const float* weights, int64_t T, float* out) {
  cpu::combine_rows_bf16(y, H, token_start, rows, weights, T, out);
}

const int32_t* const* CpuBackend::token_tables(const BlockTables& tables, int64_t T) {
  // Host memory is backend memory here, so either copy of the arrays will do.
  const int32_t* blocks = tables.host_blocks ? tables.host_blocks : tables.blocks;
  const int32_t* start = tables.host_start ? tables.host_start : tables.start;
  token_tables_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) token_tables_[t] = blocks + start[t];
  return token_tables_.data();
}

void CpuBackend::sample(const float* logits, int64_t R, int64_t V, const SampleRow* rows, const TokenEdit* edits,
                        int32_t* tokens, float* logprobs, int32_t* top_tokens, float* top_logprobs) {
  // Rows are independent and each costs several passes over the vocabulary: one sampler (its
  // scratch) per thread. A row's choice does not depend on the thread that makes it.
  const int threads = std::max(1, std::min<int>(cpu::num_threads(), static_cast<int>(R)));
  if (static_cast<int>(samplers_.size()) < threads) samplers_.resize(static_cast<size_t>(threads));
  // An exception may not leave an OpenMP region (std::terminate, no message, no job abort): the
  // first one is kept and thrown after it.
  std::exception_ptr failed;
  std::atomic<bool> any_failed{false};
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
  for (int64_t r = 0; r < R; ++r) {
    if (any_failed.load(std::memory_order_relaxed)) continue;
    const int me = threads > 1 ? omp_get_thread_num() : 0;
    try {
      const Sample s = samplers_[static_cast<size_t>(me)].sample(logits + r * V, V, rows[r], edits);
      tokens[r] = s.token;
      logprobs[r] = s.logprob;
      write_top_logprobs(logits + r * V, V, rows[r], top_tokens, top_logprobs);
    } catch (...) {
#pragma omp critical(shardlm_sample_failed)
      if (!failed) failed = std::current_exception();
      any_failed = true;
    }
  }
  if (failed) std::rethrow_exception(failed);
}

std::unique_ptr<ComputeBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace shardlm
