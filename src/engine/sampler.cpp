#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "cpu/logits_scan.h"
#include "cpu/logit_edits.h"
#include "engine/rng.h"
#include "sample_rules.h"

namespace shardlm {

float log_softmax_at(const float* logits, int64_t vocab, int64_t i) {
  return cpu::log_softmax_at(logits, vocab, i);
}

SampleRow sample_row(const SamplingParams& p, int64_t position) {
  SampleRow r;
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_k = p.top_k;
  r.seed = p.seed;
  r.position = position;
  // fp32, as vLLM holds them.
  r.repetition_penalty = static_cast<float>(p.repetition_penalty);
  r.frequency_penalty = static_cast<float>(p.frequency_penalty);
  r.presence_penalty = static_cast<float>(p.presence_penalty);
  return r;
}

Sample Sampler::sample(const float* logits, int64_t vocab, const SampleRow& row, const TokenEdit* edits) {
  // The choice below reads temperature, top_k, top_p, min_p and seed, after the penalties; the
  // other fields (max_tokens, stop, ignore_eos) only decide when a sequence ends.
  if (row.target >= 0) {
    SHARDLM_CHECK(row.target < vocab, "sampling: scored token " << row.target << " outside a vocabulary of " << vocab);
    return {row.target, log_softmax_at(logits, vocab, row.target)};
  }
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  p.top_k = row.top_k;
  p.seed = row.seed;
  if (!row.edited()) return sample(logits, vocab, p, row.position);
  SHARDLM_CHECK(edits || row.edits_count == 0, "sampling: an edited row without the step's token edits");
  edited_.resize(static_cast<size_t>(vocab));
  cpu::edited_row(logits, vocab, edits + row.edits_begin, row.edits_count, row.allowed_only, row.repetition_penalty,
                  row.frequency_penalty, row.presence_penalty, edited_.data());
  // The logprob is the raw row's, not the edited one the choice was made on.
  const int32_t token = choose(edited_.data(), vocab, p, row.position, nullptr);
  return {token, log_softmax_at(logits, vocab, token)};
}

void write_top_logprobs(const float* logits, int64_t vocab, const SampleRow& row, int32_t* top_tokens,
                        float* top_logprobs) {
  if (row.top_n <= 0) return;
  SHARDLM_CHECK(top_tokens && top_logprobs && row.top_n <= kMaxTopLogprobs,
                "sampling: a row asks for " << row.top_n << " top logprobs (at most " << kMaxTopLogprobs
                                            << ", and the step's top arrays)");
  cpu::top_logprobs(logits, vocab, row.top_n, top_tokens + row.top_begin, top_logprobs + row.top_begin);
}

Sample Sampler::sample(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position) {
  float row_max = NAN;
  const int32_t token = choose(logits, vocab, p, position, &row_max);
  // A greedy choice found the row's maximum already: one read of the row fewer.
  return {token, std::isnan(row_max) ? log_softmax_at(logits, vocab, token)
                                     : cpu::log_softmax_at(logits, vocab, token, row_max)};
}

int32_t Sampler::choose(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position,
                        float* greedy_max) {
  if (p.temperature <= 0.0) {
    float row_max = 0;
    const auto token = static_cast<int32_t>(cpu::argmax_logit(logits, vocab, &row_max));
    if (greedy_max) *greedy_max = row_max;
    return token;
  }
  SHARDLM_CHECK(vocab <= sampling::kMaxVocab,
                "sampling: a vocabulary of " << vocab << " is above the sampler's " << sampling::kMaxVocab);
  float top = 0;
  const int64_t best = cpu::argmax_logit(logits, vocab, &top);
  const double inv_t = 1.0 / p.temperature;
  if (!std::isfinite(top) || !std::isfinite(inv_t)) {
    // No finite maximum (a row of NaN or infinities) or an infinitely sharp temperature: the
    // tempered probabilities are not defined, the most likely token is.
    return static_cast<int32_t>(best);
  }
  bands_.build(logits, vocab, top, inv_t);
  using Prefix = CandidateBands::Prefix;
  Prefix kept = bands_.all();
  if (p.top_k > 0 && p.top_k < vocab) kept = bands_.first_count(kept, p.top_k);
  if (p.min_p > 0.0) {
    // Through the last kept candidate at least min_p times as likely as the first (probability 1).
    // Weightless tokens are never drawn, so where the cut falls among them changes nothing.
    const double cutoff = p.min_p;
    const int scan = std::min(kept.band, cpu::kWeightlessBand - 1);
    bands_.compute_through(scan);
    uint64_t last = sampling::candidate_key(logits[best], static_cast<uint32_t>(best));
    for (int64_t i = 0; i < vocab; ++i) {
      if (bands_.band_of(i) > scan || !(bands_.prob(i) >= cutoff)) continue;
      const uint64_t key = sampling::candidate_key(logits[i], static_cast<uint32_t>(i));
      if (key > last && bands_.contains(kept, i)) last = key;
    }
    kept = bands_.through(last);
  }
  // top-p last, over the mass top-k and min-p left: vLLM's order (min-p is a logits processor that
  // runs before its top-k/top-p step).
  if (p.top_p < 1.0) {
    const double target = p.top_p * static_cast<double>(bands_.weight_of(kept));
    kept = bands_.first_weight(kept, [target](int64_t w) { return static_cast<double>(w) >= target; });
  }
  const double u = static_cast<double>(uniform_at(p.seed, static_cast<uint64_t>(position))) *
                   static_cast<double>(bands_.weight_of(kept));
  const Prefix pick = bands_.first_weight(kept, [u](int64_t w) { return static_cast<double>(w) > u; });
  return static_cast<int32_t>(bands_.last_key(pick) & 0xffffffffu);
}

}  // namespace shardlm
