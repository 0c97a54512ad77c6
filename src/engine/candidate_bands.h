// One row's sampling candidates grouped in bands of tempered probability, for the host sampler's
// cuts (top-k, top-p, min-p, the draw) without sorting the vocabulary or, where a cut stops early,
// exponentiating all of it.
//
// A band holds the tokens whose (max - logit) / T falls in one 1/8-nat step (kernels/cpu/
// logits_scan.h), so the bands follow the candidate order (sampling::candidate_key): every token
// of band b comes before every token of band b + 1. Building counts the bands; a band's
// probabilities and weight (the sum of sampling::weight, an exact integer)
// are computed when a cut first needs them, and only the band a cut falls in is sorted: for a
// 32000-token row that is a few hundred keys. Tokens from cpu::kWeightlessBand on weigh 0.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/logit_order.h"
#include "sample_rules.h"

namespace shardlm {

class CandidateBands {
 public:
  // A prefix of the candidate order: every band before `band` whole and the first `rank` tokens of
  // `band`; `count` tokens in all, weighing `weight` (-1: not computed yet, see weight_of).
  struct Prefix {
    int band = 0;
    int64_t rank = 0;
    int64_t count = 0;
    int64_t weight = -1;
  };

  // Bands, their counts and token lists for one row; top is the row's largest logit, finite, as is
  // inv_t = 1 / T. Buffers are reused across rows.
  void build(const float* logits, int64_t vocab, double top, double inv_t);

  // The whole row.
  Prefix all() const { return all_; }
  // A prefix's weight, computing what it needs.
  int64_t weight_of(const Prefix& p);

  // The first `k` tokens (k <= within.count) of `within`; the weight is left to weight_of.
  Prefix first_count(const Prefix& within, int64_t k);
  // The shortest prefix of `within` for which pred(weight) holds, pred monotone along the order
  // (false, then true); `within` itself when it never holds.
  template <typename Pred>
  Prefix first_weight(const Prefix& within, Pred pred);

  // The prefix that ends at the token with this candidate key.
  Prefix through(uint64_t key);
  // The candidate key of a non-empty prefix's last token.
  uint64_t last_key(const Prefix& p) { return sorted_band(p.band)[static_cast<size_t>(p.rank - 1)]; }
  // Whether token `id` is in prefix p.
  bool contains(const Prefix& p, int64_t id);

  // The probabilities of every band up to b (up to the last band that weighs anything), for prob().
  void compute_through(int b);
  int band_of(int64_t id) const { return band_[static_cast<size_t>(id)]; }
  float prob(int64_t id) const { return probs_[static_cast<size_t>(id)]; }

 private:
  int64_t token_weight(uint64_t key) const;
  // Band b's candidate keys in order, sorted on first use in this row.
  const std::vector<uint64_t>& sorted_band(int b);

  const float* logits_ = nullptr;
  int64_t vocab_ = 0;
  double top_ = 0, inv_t_ = 0;
  std::vector<float> probs_;
  std::vector<uint16_t> band_;
  std::vector<int64_t> count_, weight_, start_;  // start_[b]: tokens in the bands before b
  int computed_ = -1;                            // bands 0..computed_ have probabilities and weights
  Prefix all_;
  std::vector<int> sorted_at_;                 // per band: index into sorted_, or -1
  std::vector<std::vector<uint64_t>> sorted_;  // bands sorted for this row
  std::vector<int32_t> ids_;                   // scratch: the tokens being weighed
  std::vector<float> scratch_;
  std::vector<int64_t> acc_;
  LogitOrder sorter_;
};

template <typename Pred>
CandidateBands::Prefix CandidateBands::first_weight(const Prefix& within, Pred pred) {
  const int64_t within_weight = weight_of(within);
  int64_t c = 0, w = 0;
  for (int b = 0; b <= within.band; ++b) {
    compute_through(b);
    const bool whole = b < within.band || within.rank == count_[b];
    const int64_t bc = whole ? count_[b] : within.rank;
    const int64_t bw = whole ? weight_[b] : within_weight - w;
    if (bc == 0) continue;
    if (!pred(w + bw)) {
      c += bc;
      w += bw;
      continue;
    }
    const std::vector<uint64_t>& keys = sorted_band(b);
    for (int64_t r = 0; r < bc; ++r) {
      ++c;
      w += token_weight(keys[static_cast<size_t>(r)]);
      if (pred(w)) return Prefix{b, r + 1, c, w};
    }
  }
  Prefix p = within;
  p.weight = within_weight;
  return p;
}

}  // namespace shardlm
