// The context limit of a run (--max-model-len, as vLLM's): the most tokens, prompt and output, one
// request may hold. Resolved once every rank knows its KV budget and before any rank allocates its
// cache, so that every replica of the job keeps the same limit and the output file can record it.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

class Communicator;

struct ContextLimit {
  int64_t tokens = 0;     // the limit every engine of the job keeps
  bool by_cache = false;  // not asked for, and the cache holds less than the model's context
};

// A requested limit (0: none) the model cannot take fails, naming the model's context: at start,
// before any weight is read.
void check_max_model_len(int64_t requested, int64_t model_len, const std::string& model_dir);

// requested: --max-model-len (0: the model's context, or the cache's where less); model_len: the
// model's max_position_embeddings; own_blocks: the KV blocks of block_size tokens this rank's budget
// holds, capped as its cache will be. Collective over world (null: a job of one rank): the smallest
// rank's cache decides, and a requested limit that it cannot hold fails on every rank alike.
ContextLimit resolve_context_limit(int64_t requested, int64_t model_len, int64_t own_blocks, int64_t block_size,
                                   Communicator* world);

// On rank 0: says a limit the cache set, and where a resumed file's earlier sessions (earlier: the
// limit they kept, 0 if unknown) had another one that was not asked for. Such a limit is not a
// setting that --resume and merge compare: array tasks and requeued sessions on other nodes size
// their caches by the memory they find free, a few blocks apart.
void say_context_limit(const ContextLimit& c, int64_t model_len, int64_t earlier);

}  // namespace shardlm
