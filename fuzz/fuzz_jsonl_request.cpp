// libFuzzer target: parse_jsonl_line on arbitrary bytes (invalid UTF-8, embedded NULs, deep
// nesting, huge numbers...). It must never throw: every problem comes back as ParsedRequest::error.
// Also checks the result is consistent: an error carries no prompt, a success carries exactly one
// of prompt / prompt_token_ids, a non-empty id, valid UTF-8 text and in-range sampling overrides;
// an error row, an id (or none) that the file can store.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/utf8.h"
#include "io/request_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  const int64_t line_no = static_cast<int64_t>(size) + 1;
  shardlm::ParsedRequest r = shardlm::parse_jsonl_line(line, line_no);  // must not throw
  if (r.line != line_no) std::abort();
  if (!r.error.empty()) {
    if (r.prompt || r.prompt_token_ids) std::abort();
    if (!shardlm::is_valid_utf8(r.error)) std::abort();  // messages go to UTF-8 outputs
    // An error row's id (empty where it could not be read) is stored whole in a UTF-8 column.
    if (!shardlm::is_valid_utf8(r.id) || r.id.find('\0') != std::string::npos) std::abort();
    return 0;
  }
  if (r.prompt.has_value() == r.prompt_token_ids.has_value()) std::abort();
  if (r.id.empty() || !shardlm::is_valid_utf8(r.id)) std::abort();
  if (r.prompt && (r.prompt->empty() || !shardlm::is_valid_utf8(*r.prompt))) std::abort();
  if (r.prompt_token_ids) {
    if (r.prompt_token_ids->empty()) std::abort();
    for (int32_t id : *r.prompt_token_ids)
      if (id < 0) std::abort();
  }
  const auto& o = r.overrides;
  if (o.max_tokens && *o.max_tokens < 1) std::abort();
  if (o.repetition_penalty && !(*o.repetition_penalty > 0 && std::isfinite(*o.repetition_penalty))) std::abort();
  if (o.frequency_penalty && !(*o.frequency_penalty >= -2 && *o.frequency_penalty <= 2)) std::abort();
  if (o.presence_penalty && !(*o.presence_penalty >= -2 && *o.presence_penalty <= 2)) std::abort();
  if (o.temperature && !(*o.temperature >= 0 && *o.temperature <= 2)) std::abort();
  if (o.logprobs && !(*o.logprobs >= 0 && *o.logprobs <= shardlm::kMaxTopLogprobs)) std::abort();
  if (o.prompt_logprobs && !(*o.prompt_logprobs >= 0 && *o.prompt_logprobs <= shardlm::kMaxTopLogprobs)) std::abort();
  if (o.top_p && !(*o.top_p > 0 && *o.top_p <= 1)) std::abort();
  if (o.min_p && !(*o.min_p >= 0 && *o.min_p <= 1)) std::abort();
  if (o.top_k && *o.top_k < -1) std::abort();
  if (o.stop)
    for (const auto& s : *o.stop)
      if (s.empty() || !shardlm::is_valid_utf8(s)) std::abort();
  // The logit controls: ids >= 0, biases finite in [-100, 100] and by distinct increasing ids.
  if (o.min_tokens && *o.min_tokens < 0) std::abort();
  if (o.allowed_token_ids) {
    if (o.allowed_token_ids->empty()) std::abort();
    for (int32_t id : *o.allowed_token_ids)
      if (id < 0) std::abort();
  }
  if (o.logit_bias) {
    int64_t last = -1;
    for (const auto& [id, bias] : *o.logit_bias) {
      if (id <= last || !(bias >= -100.0f && bias <= 100.0f)) std::abort();
      last = id;
    }
  }
  return 0;
}
