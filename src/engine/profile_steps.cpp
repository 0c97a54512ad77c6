#include "engine/profile_steps.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"

namespace shardlm {

namespace {

// The sampler's longest path: temperature with every filter on, after penalties on as many seen
// tokens as the row's sequence can hold (a CUDA backend allocates its penalized copy of the logits
// and the seen-token entries then, so that the KV budget measured after these steps leaves room).
SampleRow profile_row(int64_t position) {
  SampleRow r;
  r.temperature = 1.0;
  r.top_p = 0.9;
  r.min_p = 0.01;
  r.top_k = 40;
  r.seed = 1;
  r.position = position;
  // The top arrays exist before the budget is read. One alternative a row, not the most a request
  // may ask for: at 8 bytes an alternative their later growth is a few KiB, while each alternative
  // is another pass over the row.
  r.top_n = 1;
  return r;
}

// Logit rows on `want` of the step's tokens (at least the ones it has): the peak step with
// --max-logit-rows above its sequences, as prefill chunks of prompts with prompt logprobs make it.
void add_logit_rows(ForwardBatch* b, int64_t want) {
  std::vector<bool> is_row(static_cast<size_t>(b->num_tokens()), false);
  for (int32_t r : b->logit_rows) is_row[static_cast<size_t>(r)] = true;
  int64_t have = static_cast<int64_t>(b->logit_rows.size());
  for (int64_t t = 0; t < b->num_tokens() && have < want; ++t) {
    if (!is_row[static_cast<size_t>(t)]) is_row[static_cast<size_t>(t)] = true, ++have;
  }
  b->logit_rows.clear();
  for (int64_t t = 0; t < b->num_tokens(); ++t)
    if (is_row[static_cast<size_t>(t)]) b->logit_rows.push_back(static_cast<int32_t>(t));
}

void add_sampled_rows(ForwardBatch* b, int64_t vocab) {
  int64_t top = 0;
  for (int32_t row : b->logit_rows) {
    const int64_t position = b->positions[static_cast<size_t>(row)];
    SampleRow r = profile_row(position);
    r.repetition_penalty = 1.1f;
    r.edits_begin = static_cast<int64_t>(b->token_edits.size());
    r.edits_count = std::min(position + 1, vocab);  // distinct tokens: at most the sequence's length
    for (int64_t t = 0; t < r.edits_count; ++t) b->token_edits.push_back({static_cast<int32_t>(t), 1});
    r.top_begin = top;
    top += r.top_n;
    b->sample_rows.push_back(r);
  }
}

}  // namespace

ProfileSteps make_profile_steps(const SchedulerConfig& cfg, int64_t max_len, int64_t vocab, int stages) {
  SHARDLM_CHECK(cfg.max_batch_tokens > 0 && cfg.max_seqs > 0 && cfg.block_size > 0 && max_len > 0 && vocab > 0,
                "profile steps of " << cfg.max_batch_tokens << " tokens, " << cfg.max_seqs << " sequences, blocks of "
                                    << cfg.block_size << ", context " << max_len << ", vocabulary " << vocab);
  const int64_t bs = cfg.block_size;
  const int64_t seqs = std::max<int64_t>(1, (cfg.max_seqs + stages - 1) / stages);
  const int64_t tokens = std::min(cfg.max_batch_tokens, seqs * max_len);
  // Decode tokens need the first chunk to fill a whole block; each takes a sequence from the chunks.
  int64_t decodes = tokens > bs ? std::min(seqs - 1, tokens - bs) : 0;
  auto chunks_for = [&](int64_t d) { return (tokens - d + max_len - 1) / max_len; };
  while (decodes > 0 && decodes + chunks_for(decodes) > seqs) --decodes;
  const int64_t chunks = chunks_for(decodes);

  // Token ids spread over the vocabulary, so routed experts see many of them.
  std::vector<int32_t> ids(static_cast<size_t>(max_len));
  for (int64_t p = 0; p < max_len; ++p) ids[static_cast<size_t>(p)] = static_cast<int32_t>((p * 7919 + 13) % vocab);

  ProfileSteps s;
  int32_t next_block = 0;
  const int32_t first_block = 0;  // the first chunk's first block (numbered first): the decode tokens read it
  int64_t left = tokens - decodes;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t len = std::min(left, max_len);
    left -= len;
    std::vector<int32_t> table(static_cast<size_t>((len + bs - 1) / bs));
    for (auto& b : table) b = next_block++;
    s.peak.add_chunk(ids.data(), 0, len, table, bs, /*wants_logits=*/true);
  }
  // The last block's first position: every block before it is the filled one.
  const int64_t at = (max_len - 1) / bs * bs;
  std::vector<int32_t> table(static_cast<size_t>(at / bs + 1), first_block);
  // Without a filled block (a budget of one block or less) there is no decode token at all.
  std::vector<int32_t> own(static_cast<size_t>(tokens > bs ? seqs : 0));
  for (auto& b : own) b = next_block++;
  for (int64_t d = 0; d < decodes; ++d) {
    table.back() = own[static_cast<size_t>(d)];
    s.peak.add_chunk(ids.data(), at, 1, table, bs, true);
  }
  for (int32_t b : own) {
    table.back() = b;
    s.decode.add_chunk(ids.data(), at, 1, table, bs, true);
  }
  add_logit_rows(&s.peak, (cfg.logit_rows() + stages - 1) / stages);
  add_sampled_rows(&s.peak, vocab);
  add_sampled_rows(&s.decode, vocab);
  s.blocks = next_block;
  return s;
}

ProfileResult run_profile_steps(Model& model, ComputeBackend& backend, bool leader, const SchedulerConfig& cfg,
                                DType kv_dtype) {
  const ModelSpec& spec = model.spec();
  const ProfileSteps steps = make_profile_steps(cfg, context_limit(spec, cfg), spec.vocab_size, model.shard().stages);
  size_t free_before = 0, free_after = 0, total = 0;
  const bool measured = backend.device_memory(&free_before, &total);
  StepChoices choices;
  try {
    // No budget limit: the block count is the cap. The cache holds the peak step's tokens, as any
    // cache the run could use must.
    model.allocate_kv_cache(std::numeric_limits<int64_t>::max() / 2, cfg.block_size, steps.blocks, kv_dtype);
    for (const ForwardBatch* b : {&steps.peak, &steps.decode}) {
      if (b->num_tokens() == 0) continue;
      // As the engine and serve_replica_steps run a step: the leader begins and ends it (the
      // choices made where the logits end), every other rank runs its part.
      if (leader) {
        model.begin_step(*b);
        model.end_step_sampled(&choices);
      } else {
        model.forward(*b, nullptr);
      }
    }
  } catch (const Error& e) {
    const size_t seqs = std::max(steps.peak.logit_rows.size(), steps.decode.logit_rows.size());
    const std::string what = e.what();
    // Only a failed allocation is a step too large for the memory left; anything else (a comm
    // timeout, a kernel's limit) is passed on as it is, without that advice.
    if (what.find("out of memory") == std::string::npos) {
      SHARDLM_FAIL("the profile steps, the largest a step can be (" << steps.peak.num_tokens() << " tokens, " << seqs
                                                                    << " sequences), failed: " << what);
    }
    SHARDLM_FAIL("the profile steps, the largest a step can be ("
                 << steps.peak.num_tokens() << " tokens by --max-batch-tokens, " << seqs
                 << " sequences by --max-seqs), do not fit beside the weights: lower those or use more ranks. "
                 << what);
  }
  model.release_kv_cache();
  ProfileResult r;
  r.tokens = steps.peak.num_tokens();
  if (measured && backend.device_memory(&free_after, &total)) {
    r.grew_bytes = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
  }
  return r;
}

}  // namespace shardlm
