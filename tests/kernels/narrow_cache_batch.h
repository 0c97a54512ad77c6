// What the narrow KV cache tests (bf16, fp8) share: random rows, a thread-count guard, and a batch
// of three sequences with scrambled, interleaved physical blocks whose tokens go in one call (a
// chunk of A, B's decode token, the start of C, and a padding token).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "cpu/threads.h"

namespace shardlm::test {

struct ThreadGuard {
  int saved = cpu::num_threads();
  ~ThreadGuard() { cpu::set_num_threads(saved); }
};

inline std::vector<float> rand_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-scale, scale);
  std::vector<float> v(n);
  for (auto& e : v) e = U(rng);
  return v;
}

struct Batch {
  std::vector<int32_t> tA{9, 2, 7, 4, 0, 11}, tB{5, 1, 10}, tC{3};
  int64_t lenA = 81, lenB = 45, lenC = 12;
  std::vector<int32_t> pos;
  std::vector<const int32_t*> bt;
  Batch() {
    for (int32_t p = 60; p < lenA; ++p) pos.push_back(p), bt.push_back(tA.data());
    pos.push_back(static_cast<int32_t>(lenB - 1)), bt.push_back(tB.data());
    for (int32_t p = 0; p < lenC; ++p) pos.push_back(p), bt.push_back(tC.data());
    pos.push_back(-1), bt.push_back(tC.data());
  }
  int64_t T() const { return static_cast<int64_t>(pos.size()); }
  static std::vector<int64_t> slots(const std::vector<int32_t>& table, int64_t len, int64_t bs) {
    std::vector<int64_t> s(static_cast<size_t>(len));
    for (int64_t p = 0; p < len; ++p) s[p] = table[p / bs] * bs + p % bs;
    return s;
  }
};

}  // namespace shardlm::test
