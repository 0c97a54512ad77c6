// Two steps straight through Model: a fresh cache, every prompt but its last token prefilled (no
// logits), then each prompt's last token with its logits. For tests that compare models, or what a
// model's steps leave behind, without the engine.
#pragma once

#include <cstdint>
#include <vector>

#include "arch/model.h"

namespace shardlm::test {

// Returns the second step's logits ([prompts, vocab]). Each prompt takes two blocks of 16 tokens.
inline std::vector<float> prefill_then_decode(Model& m, const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t bs = 16;
  m.allocate_kv_cache(int64_t{1} << 30, bs, 2 * static_cast<int64_t>(prompts.size()));
  ForwardBatch prefill, decode;
  prefill.clear();
  decode.clear();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> table = {static_cast<int32_t>(2 * i), static_cast<int32_t>(2 * i + 1)};
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    prefill.add_chunk(prompts[i].data(), 0, n - 1, table, bs, false);
    decode.add_chunk(prompts[i].data(), n - 1, 1, table, bs, true);
  }
  std::vector<float> logits(decode.logit_rows.size() * static_cast<size_t>(m.spec().vocab_size));
  m.forward(prefill, nullptr);
  m.forward(decode, logits.data());
  return logits;
}

}  // namespace shardlm::test
