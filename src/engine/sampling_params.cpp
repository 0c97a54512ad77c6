#include "engine/sampling_params.h"

#include <cmath>

#include "engine/rng.h"

namespace shardlm {

SamplingParams SamplingParams::resolved(const SamplingOverrides& o, const std::string& request_id) const {
  SamplingParams p = *this;
  if (o.max_tokens) p.max_tokens = *o.max_tokens;
  if (o.temperature) p.temperature = *o.temperature;
  // As vLLM's SamplingParams: above 0 and below 1e-2 is raised to 1e-2 (a sharper temperature only
  // overflows the exponentials), before its greedy test, so only 0 is greedy.
  if (p.temperature > 0 && p.temperature < kLowestTemperature) p.temperature = kLowestTemperature;
  if (o.top_p) p.top_p = *o.top_p;
  if (o.top_k) p.top_k = *o.top_k;
  if (o.min_p) p.min_p = *o.min_p;
  if (o.repetition_penalty) p.repetition_penalty = *o.repetition_penalty;
  if (o.frequency_penalty) p.frequency_penalty = *o.frequency_penalty;
  if (o.presence_penalty) p.presence_penalty = *o.presence_penalty;
  if (o.stop) p.stop = *o.stop;
  if (o.stop_token_ids) p.stop_token_ids = *o.stop_token_ids;
  if (o.ignore_eos) p.ignore_eos = *o.ignore_eos;
  if (o.logprobs) p.logprobs = *o.logprobs;
  if (o.prompt_logprobs) p.prompt_logprobs = *o.prompt_logprobs;
  if (o.allowed_token_ids) p.allowed_token_ids = *o.allowed_token_ids;
  if (o.min_tokens) p.min_tokens = *o.min_tokens;
  if (o.logit_bias) p.logit_bias = *o.logit_bias;
  p.seed = o.seed ? *o.seed : hash_string64(request_id.data(), request_id.size(), seed);
  return p;
}

std::string SamplingParams::validate() const {
  if (max_tokens < 1) return "max_tokens must be >= 1";
  if (!(temperature >= 0 && temperature <= 2)) return "temperature must be in [0, 2]";  // vLLM's bound
  if (!std::isfinite(top_p) || top_p <= 0 || top_p > 1) return "top_p must be in (0, 1]";
  if (top_k < -1) return "top_k must be -1, 0 (off) or positive";
  if (!std::isfinite(min_p) || min_p < 0 || min_p > 1) return "min_p must be in [0, 1]";
  // vLLM's bounds.
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0) return "repetition_penalty must be finite and > 0";
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) return "frequency_penalty must be in [-2, 2]";
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) return "presence_penalty must be in [-2, 2]";
  // vLLM's max_logprobs (20 by default).
  if (logprobs < 0 || logprobs > kMaxTopLogprobs)
    return "logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "]";
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxTopLogprobs)
    return "prompt_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "] (or -1: none)";
  if (min_tokens < 0) return "min_tokens must be >= 0";
  if (min_tokens > max_tokens)  // vLLM's bound
    return "min_tokens (" + std::to_string(min_tokens) + ") must be at most max_tokens (" + std::to_string(max_tokens) +
           ")";
  for (const auto& s : stop) {
    if (s.empty()) return "stop strings must not be empty";
  }
  return {};
}

std::string SamplingParams::validate_token_ids(int64_t vocab) const {
  const auto outside = [vocab](int32_t id) { return id < 0 || id >= vocab; };
  const std::string range = " is outside the vocabulary [0, " + std::to_string(vocab) + ")";
  for (int32_t id : allowed_token_ids)
    if (outside(id)) return "allowed_token_ids: token id " + std::to_string(id) + range;
  for (const auto& [id, bias] : logit_bias)
    if (outside(id)) return "logit_bias: token id " + std::to_string(id) + range;
  return {};
}

}  // namespace shardlm
