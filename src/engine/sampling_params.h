// Resolved sampling settings of one request (run defaults overridden per request).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/request.h"

namespace shardlm {

// vLLM's lowest sampling temperature (_MAX_TEMP): one above 0 and below it is raised to it.
constexpr double kLowestTemperature = 1e-2;

struct SamplingParams {
  int64_t max_tokens = 128;
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;        // 1: off
  int64_t top_k = 0;         // 0 or -1: off
  double min_p = 0.0;        // 0: off
  uint64_t seed = 0;
  // vLLM's penalties: repetition on the tokens of the prompt and the output so far (> 0; 1 off),
  // frequency per occurrence and presence once on those of the output (in [-2, 2]; 0 off).
  double repetition_penalty = 1.0;
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  std::vector<std::string> stop;
  // Generating one of these ends the request (finish reason stop), as vLLM's stop_token_ids do:
  // the token is kept in the output, and ignore_eos does not apply to them.
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // The N most likely tokens written at each output position (0: the chosen token's logprob
  // alone), and at each prompt position (-1: no prompt logprobs; 0: the prompt token's alone):
  // vLLM's logprobs and prompt_logprobs, both of the raw logits.
  int32_t logprobs = 0;
  int32_t prompt_logprobs = -1;
  // vLLM's logit controls (SamplingOverrides): empty allowed_token_ids allows every token.
  std::vector<int32_t> allowed_token_ids;
  int64_t min_tokens = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // by token id, distinct

  // Applies a request's overrides on top of these defaults, with vLLM's temperature bounds. A
  // request without its own seed gets one derived from the run seed and its id, so its samples do
  // not depend on its batch.
  SamplingParams resolved(const SamplingOverrides& o, const std::string& request_id) const;
  // Empty when valid, else the problem ("temperature must be in [0, 2]"); vLLM's bounds.
  std::string validate() const;
  // Empty when every id of allowed_token_ids and logit_bias is in [0, vocab), else which is not.
  std::string validate_token_ids(int64_t vocab) const;
  bool scores_prompt() const { return prompt_logprobs >= 0; }
  bool penalized() const { return repetition_penalty != 1.0 || frequency_penalty != 0.0 || presence_penalty != 0.0; }
  // Whether a row of this request, its output `out` tokens long, changes logits before the choice.
  bool edits_logits(int64_t out) const {
    return penalized() || !allowed_token_ids.empty() || !logit_bias.empty() || out < min_tokens;
  }
};

}  // namespace shardlm
