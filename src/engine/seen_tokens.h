// The distinct tokens a sequence has seen, each with its count in the sequence's output: what
// vLLM's repetition, frequency and presence penalties read. Kept up to date incrementally: an
// update reads only the tokens added since the last (a decode step's one), not the sequence.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "compute/backend.h"

namespace shardlm {

class SeenTokens {
 public:
  // Brings the list up to `tokens`, whose first prompt_len are the prompt and the rest the output,
  // reading only the tokens added since the last call (tokens only grow).
  void update(const std::vector<int32_t>& tokens, int64_t prompt_len);
  // One entry per distinct token, in order of first appearance.
  const std::vector<TokenEdit>& list() const { return list_; }

 private:
  std::vector<TokenEdit> list_;
  std::unordered_map<int32_t, size_t> index_;  // token -> its entry in list_
  int64_t read_ = 0;                           // leading tokens counted
};

}  // namespace shardlm
