// ComputeBackend: the op interface model code is written against.
//
// Pointers passed to ops are backend memory (host memory for "cpu", device memory for "cuda").
// Activations are fp32. Weights are loaded once through load_matrix / load_vector, which may keep
// a zero-copy view of the memory-mapped checkpoint (cpu) or copy to the device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

struct TensorView;

// A 2-D weight [rows, cols] (a Linear weight is [out_features, in_features]).
struct Matrix {
  DType dtype = DType::F32;  // F32 or BF16 (others are converted at load)
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
};

// A 1-D fp32 weight (norm scales, biases).
struct Vector {
  int64_t n = 0;
  const float* data = nullptr;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual std::string name() const = 0;

  // Weight loading. Matrices in F32/BF16 may be used in place; other dtypes are converted.
  virtual Matrix load_matrix(const TensorView& t) = 0;
  virtual Vector load_vector(const TensorView& t) = 0;

  // Activation memory, owned by the backend, freed when the backend is destroyed or by free().
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;

  // ---- ops (shapes row-major; see kernels/ for exact semantics) ----
  virtual void embedding(const int32_t* ids, int64_t T, const Matrix& table, float* out) = 0;
  virtual void rmsnorm(const float* x, const Vector& w, int64_t rows, float eps, float* out) = 0;
  // residual += x; out = rmsnorm(residual)
  virtual void add_rmsnorm(float* residual, const float* x, const Vector& w, int64_t rows, float eps,
                           float* out) = 0;
  // y[M, W.rows] = x[M, W.cols] · W^T (+ bias)
  virtual void linear(const float* x, int64_t M, const Matrix& w, const Vector* bias, float* y) = 0;
  virtual void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                    const float* inv_freq) = 0;
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  virtual void add(float* y, const float* x, int64_t n) = 0;
  virtual void kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads,
                        int64_t head_dim, float* k_cache, float* v_cache) = 0;
  virtual void attention(const float* q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         const float* k_cache, const float* v_cache, int64_t block_size,
                         const int32_t* const* block_table, const int32_t* pos, int64_t window, float scale,
                         float* out) = 0;
};

// Backend registry (src/compute/backend_registry.cpp): a backend is added by one file defining its
// factory and one line in that table.
std::unique_ptr<ComputeBackend> make_backend(const std::string& name);  // throws Error listing names
std::vector<std::string> backend_names();

}  // namespace shardlm
