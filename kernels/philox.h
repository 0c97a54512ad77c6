// Philox4x32-10 and the (seed, position) uniform of src/engine/rng.cpp, in a header that both g++
// and nvcc compile, so a device sampler draws exactly the numbers the host sampler draws.
// tests/cuda/test_philox_header.cpp checks it against rng.cpp on the host.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace shardlm::rng {

struct Philox4 {
  uint32_t v[4];
};

SHARDLM_HD inline Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                        uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform float in [0, 1) with 24 random bits: counter (position, draw), key seed.
SHARDLM_HD inline float uniform_at(uint64_t seed, uint64_t position, uint32_t draw = 0) {
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), draw, 0,
                                  static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace shardlm::rng

