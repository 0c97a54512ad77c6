// The last stage's message for a sampled step (the choices made where the logits end): R tokens,
// the R logprobs' bits, then the K top alternatives' tokens and logprobs' bits, as one int32
// message.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "arch/model.h"

namespace shardlm {

inline void pack_choices(const StepChoices& c, std::vector<int32_t>* out) {
  const size_t R = c.tokens.size(), K = c.top_tokens.size();
  out->resize(2 * R + 2 * K);
  int32_t* at = out->data();
  std::copy(c.tokens.begin(), c.tokens.end(), at);
  if (R > 0) std::memcpy(at + R, c.logprobs.data(), R * sizeof(float));
  std::copy(c.top_tokens.begin(), c.top_tokens.end(), at + 2 * R);
  if (K > 0) std::memcpy(at + 2 * R + K, c.top_logprobs.data(), K * sizeof(float));
}

// The message's length for a step of R rows with K top alternatives in all.
inline size_t choices_length(int64_t R, int64_t K) { return static_cast<size_t>(2 * R + 2 * K); }

inline void unpack_choices(const std::vector<int32_t>& in, int64_t R, int64_t K, StepChoices* c) {
  c->resize(R, K);
  const int32_t* at = in.data();
  std::copy(at, at + R, c->tokens.begin());
  if (R > 0) std::memcpy(c->logprobs.data(), at + R, static_cast<size_t>(R) * sizeof(float));
  std::copy(at + 2 * R, at + 2 * R + K, c->top_tokens.begin());
  if (K > 0) std::memcpy(c->top_logprobs.data(), at + 2 * R + K, static_cast<size_t>(K) * sizeof(float));
}

}  // namespace shardlm
