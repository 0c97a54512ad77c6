#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu/logits_scan.h"
#include "engine/rng.h"

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
  return r;
}

Sample Sampler::sample(const float* logits, int64_t vocab, const SampleRow& row) {
  // The choice below reads temperature, top_k, top_p, min_p and seed; the other fields
  // (max_tokens, stop, ignore_eos) only decide when a sequence ends.
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  p.top_k = row.top_k;
  p.seed = row.seed;
  return sample(logits, vocab, p, row.position);
}

Sample Sampler::sample(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position) {
  Sample s;
  if (p.temperature <= 0.0) {
    float row_max = 0;
    s.token = static_cast<int32_t>(cpu::argmax_logit(logits, vocab, &row_max));
    s.logprob = cpu::log_softmax_at(logits, vocab, s.token, row_max);
    return s;
  }
  // Candidates sorted by logit, descending, ties by id: a total order, so the pick is deterministic.
  int64_t n = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    // Only the first top_k are ordered: a partial sort rejects most ids with one comparison.
    auto by_logit = [logits](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    n = p.top_k;
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), by_logit);
  } else {
    sorter_.sort(logits, vocab, &order_);  // the same order, in linear time
  }
  // Softmax of logits / T over the candidates (the first is the maximum).
  probs_.resize(n);
  const double sum = cpu::temperature_probs(logits, order_.data(), n, logits[order_[0]], 1.0 / p.temperature,
                                             probs_.data());
  // top-p: the smallest prefix whose mass reaches p (at least one token).
  if (p.top_p < 1.0) {
    double cum = 0;
    int64_t keep = n;
    for (int64_t j = 0; j < n; ++j) {
      cum += probs_[j] / sum;
      if (cum >= p.top_p) {
        keep = j + 1;
        break;
      }
    }
    n = keep;
  }
  // min-p: drop tokens below min_p times the most likely one.
  if (p.min_p > 0.0) {
    const double floor = p.min_p * probs_[0];
    int64_t keep = 1;
    while (keep < n && probs_[keep] >= floor) ++keep;
    n = keep;
  }
  double mass = 0;
  for (int64_t j = 0; j < n; ++j) mass += probs_[j];
  const double u = static_cast<double>(uniform_at(p.seed, static_cast<uint64_t>(position))) * mass;
  double cum = 0;
  int64_t pick = n - 1;
  for (int64_t j = 0; j < n; ++j) {
    cum += probs_[j];
    if (u < cum) {
      pick = j;
      break;
    }
  }
  s.token = order_[pick];
  s.logprob = log_softmax_at(logits, vocab, s.token);
  return s;
}

}  // namespace shardlm
