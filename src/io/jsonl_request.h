// Internal to src/io: the JSONL line parser behind parse_jsonl_line, with the OpenAI-only switch
// that RequestReader uses for PromptFormat::kOpenAiBatch.
#pragma once

#include <cstdint>
#include <string>

#include "io/request.h"

namespace shardlm {

// When require_openai_batch is true, a line without "custom_id" and "body" is an error instead of
// being read as a plain JSONL request.
ParsedRequest parse_jsonl_request(const std::string& line, int64_t line_no, bool require_openai_batch);

}  // namespace shardlm
