// Defaults of the optional ComputeBackend operations.
#include "compute/backend.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/checkpoint.h"

namespace shardlm {

Matrix ComputeBackend::load_fp8_matrix(const TensorView& w, const TensorView&, int64_t, int64_t, int64_t, int64_t,
                                       int64_t, int64_t, bool) {
  SHARDLM_FAIL("backend " << name() << " does not take fp8 weights itself ('" << w.name
                          << "'): the weight loader must dequantise them on the host");
}

void ComputeBackend::begin_capture() {
  SHARDLM_FAIL("backend " << name() << " cannot capture steps as graphs (--cuda-graphs needs --backend cuda)");
}

int64_t ComputeBackend::end_capture() { SHARDLM_FAIL("backend " << name() << " cannot capture steps as graphs"); }

void ComputeBackend::replay(int64_t) { SHARDLM_FAIL("backend " << name() << " cannot replay captured graphs"); }

void ComputeBackend::drop_captures() {}

int64_t ComputeBackend::mark_timeline() {
  host_marks_.push_back(std::chrono::steady_clock::now());
  return static_cast<int64_t>(host_marks_.size()) - 1;
}

double ComputeBackend::timeline_seconds(int64_t a, int64_t b) const {
  SHARDLM_CHECK(a >= 0 && b >= 0 && static_cast<size_t>(std::max(a, b)) < host_marks_.size(),
                "timeline marks " << a << " and " << b << " of " << host_marks_.size());
  return std::chrono::duration<double>(host_marks_[b] - host_marks_[a]).count();
}

void ComputeBackend::clear_timeline() { host_marks_.clear(); }

GemmFigure ComputeBackend::time_linear_gemm(int64_t, int64_t, int64_t, bool, int) {
  SHARDLM_FAIL("backend " << name() << " has no device to time GEMMs on");
}

GemmFigure ComputeBackend::time_linear(int64_t, int64_t, int64_t, DType, int) {
  SHARDLM_FAIL("backend " << name() << " has no device to time linears on");
}

std::optional<Matrix> stacked_rows(const Matrix& a, const Matrix& b) {
  if (a.dtype != b.dtype || a.cols != b.cols || a.data == nullptr || b.data == nullptr) return std::nullopt;
  if (a.dtype != DType::BF16 && a.dtype != DType::F32 && a.dtype != DType::F8_E4M3) return std::nullopt;
  if (b.data != static_cast<const uint8_t*>(a.data) + static_cast<size_t>(a.rows * a.cols) * dtype_size(a.dtype))
    return std::nullopt;
  if (a.dtype == DType::F8_E4M3) {
    const Fp8Blocks &f = a.fp8, &g = b.fp8;
    if (f.scale_inv == nullptr || f.block_rows <= 0 || g.block_rows != f.block_rows || g.block_cols != f.block_cols ||
        g.cols != f.cols || g.col_off != f.col_off || f.row_off != 0 || g.row_off != 0 || a.rows % f.block_rows != 0 ||
        g.scale_inv != f.scale_inv + (a.rows / f.block_rows) * f.cols)
      return std::nullopt;
  }
  Matrix s = a;
  s.rows += b.rows;
  return s;
}

void check_linear_parts(std::span<const LinearPart> parts, const char* who) {
  SHARDLM_CHECK(!parts.empty(), who << ": linear_parts got no parts");
  for (size_t i = 0; i < parts.size(); ++i) {
    const LinearPart& p = parts[i];
    SHARDLM_CHECK(p.w != nullptr && p.y != nullptr, who << ": linear_parts part " << i << " has no weight or output");
    SHARDLM_CHECK(p.w->cols == parts[0].w->cols, who << ": linear_parts part " << i << " is [" << p.w->rows << ", "
                                                     << p.w->cols << "], part 0 takes " << parts[0].w->cols
                                                     << " inputs");
    SHARDLM_CHECK(!p.bias || !p.bias->data || p.bias->n == p.w->rows, who << ": linear_parts part " << i
                                                                          << " has a bias of " << p.bias->n << " for "
                                                                          << p.w->rows << " rows");
  }
}

void check_grouped_linear(const std::vector<int64_t>& offsets, const std::vector<const Matrix*>& w, const char* who) {
  SHARDLM_CHECK(offsets.size() == w.size() + 1,
                who << ": grouped_linear got " << offsets.size() << " offsets for " << w.size() << " groups");
  SHARDLM_CHECK(offsets[0] >= 0, who << ": grouped_linear offsets start at " << offsets[0]);
  for (size_t g = 0; g < w.size(); ++g) {
    SHARDLM_CHECK(offsets[g + 1] >= offsets[g], who << ": grouped_linear offsets decrease at group " << g << " ("
                                                    << offsets[g] << " then " << offsets[g + 1] << ")");
    SHARDLM_CHECK(w[g] != nullptr, who << ": grouped_linear weight " << g << " is null");
    SHARDLM_CHECK(w[g]->rows == w[0]->rows && w[g]->cols == w[0]->cols,
                  who << ": grouped_linear weight " << g << " is [" << w[g]->rows << ", " << w[g]->cols
                      << "], weight 0 is [" << w[0]->rows << ", " << w[0]->cols << "]");
  }
}

void ComputeBackend::linear_parts(Activations x, int64_t M, std::span<const LinearPart> parts) {
  check_linear_parts(parts, name().c_str());
  for (const LinearPart& p : parts) linear(x, M, *p.w, p.bias, p.y);
}

void ComputeBackend::silu_mul_stacked(const float* gate_up, int64_t rows, int64_t width, ActivationsOut out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + 2 * r * width;
    silu_mul(g, g + width, {out.f32 + r * width, out.bf16 ? out.bf16 + r * width : nullptr}, width);
  }
}

void ComputeBackend::rope_kv_write(float* q, int64_t q_heads, float* k, const float* v, int64_t kv_heads, int64_t T,
                                   int64_t head_dim, const QkNorms& norms, const int32_t* pos, const float* inv_freq,
                                   const int64_t* slots, int64_t block_size, const KvCacheRef& cache) {
  if (norms.q) rmsnorm(q, *norms.q, T * q_heads, norms.eps, q);
  if (norms.k) rmsnorm(k, *norms.k, T * kv_heads, norms.eps, k);
  rope_qk(q, q_heads, k, kv_heads, T, head_dim, pos, inv_freq);
  kv_write(k, v, T, slots, kv_heads, head_dim, block_size, cache);
}

void ComputeBackend::latent_rope_cache_write(float* latent, const Vector& latent_norm, float eps, float* k_rope,
                                             const float* q_rope_in, int64_t n_heads, int64_t q_stride,
                                             int64_t q_head_stride, float* q_rope, int64_t T, int64_t kv_lora,
                                             int64_t rope_dim, const LatentRopeArgs& rope, const int64_t* slots,
                                             const KvCacheRef& cache) {
  rmsnorm(latent, latent_norm, T, eps, latent);
  rope_strided(k_rope, T, 1, rope_dim, rope_dim, rope_dim, rope.pos, rope.inv_freq, rope.interleaved,
               rope.attention_factor, k_rope);
  rope_strided(q_rope_in, T, n_heads, q_stride, q_head_stride, rope_dim, rope.pos, rope.inv_freq, rope.interleaved,
               rope.attention_factor, q_rope);
  latent_cache_write(latent, k_rope, T, slots, kv_lora, rope_dim, cache);
}

void ComputeBackend::grouped_linear(Activations x, const std::vector<int64_t>& offsets,
                                    const std::vector<const Matrix*>& w, float* y) {
  check_grouped_linear(offsets, w, name().c_str());
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n > 0) linear(x.from(r0 * w[g]->cols), n, *w[g], nullptr, y + r0 * w[g]->rows);
  }
}

void ComputeBackend::grouped_linear_routed(Activations x, int64_t max_rows, int64_t /*expect_rows*/,
                                           const int32_t* offsets, const std::vector<const Matrix*>& w, float* y) {
  std::vector<int32_t> host(w.size() + 1);
  copy_to_host(host.data(), offsets, host.size() * sizeof(int32_t));
  const std::vector<int64_t> rows(host.begin(), host.end());
  SHARDLM_CHECK(rows.back() <= max_rows, name() << ": grouped_linear_routed offsets end at " << rows.back()
                                                << ", past the " << max_rows << " rows of x");
  grouped_linear(x, rows, w, y);
}

}  // namespace shardlm
