// Test data for backend ops: random arrays, checkpoint tensor views of host bytes, random weights
// kept alive for a backend that may use them in place, and copies to and from backend memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compute/backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"

namespace shardlm::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

inline TensorView tensor_view(const std::string& name, DType dt, std::vector<int64_t> shape, const void* data,
                              size_t nbytes) {
  TensorView t;
  t.name = name;
  t.file = "test";
  t.dtype = dt;
  t.shape = std::move(shape);
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

// Random weights [rows, cols] in F32 or BF16 as checkpoint tensors; the bytes live as long as the
// store (a backend may keep using them in place after load_matrix).
class WeightStore {
 public:
  TensorView random(DType dtype, int64_t rows, int64_t cols, uint32_t seed, float scale) {
    const std::vector<float> f = randn(static_cast<size_t>(rows * cols), seed, scale);
    std::vector<uint8_t>& bytes = bytes_.emplace_back();
    if (dtype == DType::BF16) {
      bytes.resize(f.size() * 2);
      auto* p = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < f.size(); ++i) p[i] = f32_to_bf16(f[i]);
    } else {
      bytes.resize(f.size() * 4);
      std::memcpy(bytes.data(), f.data(), bytes.size());
    }
    std::string name = "w";  // appended, not "w" + ...: GCC 12 warns falsely (-Wrestrict) on that
    name += std::to_string(seed);
    return tensor_view(name, dtype, {rows, cols}, bytes.data(), bytes.size());
  }

 private:
  std::deque<std::vector<uint8_t>> bytes_;
};

// The halves of a stacked gate/up projection's rows (gate_up [rows, 2 * width]: each row's gate,
// then its up) as two arrays [rows, width].
inline void split_stacked_rows(const std::vector<float>& gate_up, int64_t rows, int64_t width, std::vector<float>* gate,
                               std::vector<float>* up) {
  gate->clear();
  up->clear();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = gate_up.data() + r * 2 * width;
    gate->insert(gate->end(), row, row + width);
    up->insert(up->end(), row + width, row + 2 * width);
  }
}

// A copy of host values in b's memory (never null, even when empty), and back.
template <typename T>
T* up(ComputeBackend& b, const std::vector<T>& h) {
  auto* p = static_cast<T*>(b.alloc(std::max<size_t>(h.size(), 1) * sizeof(T)));
  b.copy_to_device(p, h.data(), h.size() * sizeof(T));
  return p;
}
template <typename T>
std::vector<T> down(ComputeBackend& b, const T* p, size_t n) {
  std::vector<T> h(n);
  b.copy_to_host(h.data(), p, n * sizeof(T));
  return h;
}

}  // namespace shardlm::test
