#include "cli/context_limit.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

void check_max_model_len(int64_t requested, int64_t model_len, const std::string& model_dir) {
  // As vLLM: positions past the model's trained context are not run on request.
  SHARDLM_CHECK(requested <= model_len, "--max-model-len " << requested << " is more than the context of " << model_dir
                                                           << " (max_position_embeddings " << model_len << ")");
}

ContextLimit resolve_context_limit(int64_t requested, int64_t model_len, int64_t own_blocks, int64_t block_size,
                                   Communicator* world) {
  SHARDLM_CHECK(block_size > 0 && model_len > 0,
                "context limit: block size " << block_size << ", model context " << model_len);
  int64_t blocks = std::max<int64_t>(own_blocks, 0);
  if (world) world->all_reduce(&blocks, 1, CommDType::kI64, ReduceOp::kMin);
  ContextLimit c;
  // A rank's own count may be huge (a stage without layers): keep the product in range.
  const int64_t cache_tokens = blocks > INT64_MAX / block_size ? INT64_MAX : blocks * block_size;
  if (requested > 0) {
    SHARDLM_CHECK(requested <= cache_tokens,
                  "--max-model-len " << requested << ": the smallest KV cache of the job holds " << cache_tokens
                                     << " tokens, less than one sequence of it: raise --kv-cache-gb, use more ranks, "
                                        "or lower --max-model-len");
    c.tokens = requested;
  } else {
    c.tokens = std::min(model_len, cache_tokens);
    c.by_cache = c.tokens < model_len;
  }
  return c;
}

void say_context_limit(const ContextLimit& c, int64_t model_len, int64_t earlier) {
  if (c.by_cache) {
    std::fprintf(stderr,
                 "[shardlm] context limit: %lld tokens, what the smallest KV cache of the job holds (the model's "
                 "context is %lld): a longer prompt is a per-request error and generation stops for length there; "
                 "a larger --kv-cache-gb raises it, --max-model-len fixes it\n",
                 static_cast<long long>(c.tokens), static_cast<long long>(model_len));
  }
  if (earlier > 0 && c.tokens > 0 && earlier != c.tokens) {
    std::fprintf(stderr,
                 "[shardlm] warning: --resume: the file's earlier rows were made under a context limit of %lld "
                 "tokens, this session's is %lld: a request that reaches either stops at another length than it "
                 "would have; --max-model-len %lld keeps theirs\n",
                 static_cast<long long>(earlier), static_cast<long long>(c.tokens), static_cast<long long>(earlier));
  }
}

}  // namespace shardlm
