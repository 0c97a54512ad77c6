// A float's bit pattern and back, for tests that compare or plant exact bits.
#pragma once

#include <cstdint>
#include <cstring>

namespace shardlm::test {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace shardlm::test
