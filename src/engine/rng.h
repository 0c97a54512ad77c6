// Counter-based random numbers (Philox4x32-10): the value drawn for a request at a token position
// is a pure function of (seed, position), so a request's samples do not depend on what it was
// batched with, the order of scheduling, or a recompute after preemption.
#pragma once

#include <cstdint>

namespace shardlm {

struct Philox4x32 {
  uint32_t v[4];
};

// Philox4x32-10 block for counter (c0..c3) and key (k0, k1).
Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1);

// Uniform float in [0, 1) for (seed, position, draw); 24 random bits.
float uniform_at(uint64_t seed, uint64_t position, uint32_t draw = 0);

// 64-bit mix used to derive a request's seed from the run seed and its id.
uint64_t mix64(uint64_t x);
uint64_t hash_string64(const char* data, uint64_t n, uint64_t seed);

}  // namespace shardlm
