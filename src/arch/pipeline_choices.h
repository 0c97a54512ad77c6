// The last stage's message for a sampled step (the choices made where the logits end): R tokens,
// then the R logprobs' bits, as one int32 message.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace shardlm {

inline void pack_choices(const std::vector<int32_t>& tokens, const std::vector<float>& logprobs,
                         std::vector<int32_t>* out) {
  const size_t R = tokens.size();
  out->resize(2 * R);
  std::copy(tokens.begin(), tokens.end(), out->begin());
  if (R > 0) std::memcpy(out->data() + R, logprobs.data(), R * sizeof(float));
}

inline void unpack_choices(const std::vector<int32_t>& in, int64_t R, std::vector<int32_t>* tokens,
                           std::vector<float>* logprobs) {
  tokens->assign(in.begin(), in.begin() + R);
  logprobs->resize(static_cast<size_t>(R));
  if (R > 0) std::memcpy(logprobs->data(), in.data() + R, static_cast<size_t>(R) * sizeof(float));
}

}  // namespace shardlm
