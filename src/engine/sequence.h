// One request's state while it is scheduled: its tokens, KV blocks and output so far.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampling_params.h"
#include "engine/seen_tokens.h"
#include "io/request.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

struct Sequence {
  RequestResult result;          // id, prompt, output so far, timing
  SamplingParams params;
  std::vector<int32_t> tokens;   // prompt followed by the generated tokens
  int64_t computed = 0;          // leading tokens whose K/V are in the cache
  std::vector<int32_t> blocks;   // physical KV blocks, in logical order
  int64_t arrival = 0;           // order in which it was read (FIFO admission)
  int32_t preemptions = 0;
  std::unique_ptr<StreamDecoder> decoder;  // detokenises the output incrementally, after the prompt's tail
  std::string text;                        // output text so far: complete characters only
  bool text_final = false;                 // output_text is set: cut at a stop string or before a stop token
  SeenTokens seen;                         // what its penalties read (kept only when it has penalties)
  int64_t scored = 0;                      // with prompt logprobs: positions [0, scored) have theirs

  // The positions of [start, start + len) whose next token is a prompt token without its logprob
  // yet (vLLM's prompt_logprobs): [first, second). Empty without prompt logprobs, and for positions
  // a preempted sequence already scored before it was recomputed.
  std::pair<int64_t, int64_t> positions_to_score(int64_t start, int64_t len) const {
    if (!params.scores_prompt()) return {start, start};
    const int64_t from = std::max(start, scored), to = std::min(start + len, prompt_len() - 1);
    return {from, std::max(from, to)};
  }

  int64_t prompt_len() const { return static_cast<int64_t>(result.prompt_tokens.size()); }
  int64_t len() const { return static_cast<int64_t>(tokens.size()); }
};

}  // namespace shardlm
