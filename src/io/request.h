// Requests as read from a prompt file, and results as written to HDF5.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace shardlm {

// The most alternatives a request may ask for at each position, in its logprobs and
// prompt_logprobs (vLLM's max_logprobs default).
constexpr int32_t kMaxTopLogprobs = 20;

// Per-request sampling settings; unset fields take the run's defaults (see SamplingParams).
struct SamplingOverrides {
  std::optional<int64_t> max_tokens;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<double> frequency_penalty;
  std::optional<double> presence_penalty;
  std::optional<uint64_t> seed;
  std::optional<std::vector<std::string>> stop;
  std::optional<std::vector<int32_t>> stop_token_ids;
  std::optional<bool> ignore_eos;
  // vLLM's logprobs (the N most likely tokens at each output position, beside the chosen one's
  // logprob that every row has) and prompt_logprobs (each prompt token's logprob, with the N most
  // likely at its position), N in [0, kMaxTopLogprobs].
  std::optional<int32_t> logprobs;
  std::optional<int32_t> prompt_logprobs;
  // vLLM's logit controls, in the order its sampler applies them before the penalties: only these
  // tokens may be chosen; the stop tokens (EOS, stop_token_ids) are barred, and no stop ends the
  // request, before min_tokens output tokens; a bias added to a token's logit (OpenAI's
  // logit_bias, clamped to [-100, 100] as vLLM's server does).
  std::optional<std::vector<int32_t>> allowed_token_ids;
  std::optional<int64_t> min_tokens;
  std::optional<std::vector<std::pair<int32_t, float>>> logit_bias;
};

// One line of a prompt file, parsed but not tokenised. When `error` is non-empty the line could not
// be used; the request still gets a row in the output carrying that error.
struct ParsedRequest {
  // JSONL "id", OpenAI "custom_id", plain text and a JSONL line without the field: the 1-based
  // line number; empty where the line's id could not be read (not JSON, too long, a bad id).
  std::string id;
  int64_t line = 0;     // 1-based line number in the prompt file
  std::optional<std::string> prompt;                 // text prompt
  std::optional<std::vector<int32_t>> prompt_token_ids;
  SamplingOverrides overrides;
  std::string error;
};

// What a run and its output know a request by: its id, or for a line whose id could not be read
// (empty), its line number in a form no id takes (ids with a NUL are refused). So such a line's
// error row never takes the place of a request that has that id, and a resumed run still knows
// the row is there.
inline std::string request_key(const std::string& id, int64_t line) {
  return id.empty() ? std::string(1, '\0') + "line " + std::to_string(line) : id;
}

enum class FinishReason { kNone, kStop, kLength, kError, kAbort };
const char* finish_reason_name(FinishReason r);

struct RequestResult {
  std::string id;
  int64_t line = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> output_tokens;
  std::string output_text;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<float> token_logprobs;  // one per output token
  // With logprobs N > 0: the N most likely tokens at each output position and their logprobs,
  // [output tokens x N] row-major, most likely first (ties to the lower id).
  std::vector<int32_t> top_token_ids;
  std::vector<float> top_logprobs;
  // With prompt_logprobs N >= 0: log p(prompt token t | the tokens before it) for every t (NaN for
  // the first, which nothing precedes), and the N most likely tokens at each position as above,
  // [prompt tokens x N] (-1 and NaN in the first row).
  std::vector<float> prompt_logprobs;
  std::vector<int32_t> prompt_top_token_ids;
  std::vector<float> prompt_top_logprobs;
  std::string error;
  int32_t replica = 0;
  // Seconds since the run's start.
  double t_queued = 0, t_first_token = 0, t_finished = 0;
};

}  // namespace shardlm
