#include "engine/candidate_bands.h"

#include <algorithm>

#include "cpu/logits_scan.h"

namespace shardlm {

void CandidateBands::build(const float* logits, int64_t vocab, double top, double inv_t) {
  logits_ = logits;
  vocab_ = vocab;
  top_ = top;
  inv_t_ = inv_t;
  const size_t n = static_cast<size_t>(vocab);
  probs_.resize(n);
  band_.resize(n);
  cpu::temperature_bands(logits, vocab, top, inv_t, band_.data());
  count_.assign(cpu::kBands, 0);
  weight_.assign(cpu::kBands, 0);
  start_.resize(cpu::kBands + 1);
  for (size_t i = 0; i < n; ++i) ++count_[band_[i]];
  all_ = Prefix{};
  for (int b = 0; b < cpu::kBands; ++b) {
    start_[b] = all_.count;
    if (count_[b] == 0) continue;
    all_.band = b;
    all_.rank = count_[b];
    all_.count += count_[b];
  }
  start_[cpu::kBands] = all_.count;
  computed_ = -1;
  sorted_at_.assign(cpu::kBands, -1);
  sorted_.clear();
  // Room for every band, so a band's keys stay where they are while others are sorted.
  sorted_.reserve(cpu::kBands);
}

void CandidateBands::compute_through(int b) {
  // Weightless tokens are never drawn and never read.
  b = std::min(b, cpu::kWeightlessBand - 1);
  if (b <= computed_) return;
  // Ahead of the request by at least as many tokens as are done (and 256), so a walk over the bands
  // one by one costs a few passes, not one per band.
  const int64_t done = start_[computed_ + 1];
  while (b < cpu::kWeightlessBand - 1 && start_[b + 1] - done < std::max<int64_t>(256, done)) ++b;
  const int64_t todo = start_[b + 1] - done;
  const size_t n = static_cast<size_t>(vocab_);
  // Each band's weight from a scratch histogram that every token adds to without a branch.
  acc_.assign(cpu::kBands, 0);
  if (todo * 2 > vocab_) {
    // Most of the row: one pass over all of it in index order beats gathering.
    cpu::tempered_probs(logits_, vocab_, top_, inv_t_, probs_.data());
    for (size_t i = 0; i < n; ++i) acc_[band_[i]] += sampling::weight(probs_[i]);
  } else if (todo > 0) {
    ids_.resize(n);
    const size_t m = static_cast<size_t>(cpu::band_members(band_.data(), vocab_, computed_ + 1, b, ids_.data()));
    scratch_.resize(m);
    cpu::tempered_probs_at(logits_, ids_.data(), static_cast<int64_t>(m), top_, inv_t_, scratch_.data());
    for (size_t j = 0; j < m; ++j) {
      const size_t id = static_cast<size_t>(ids_[j]);
      probs_[id] = scratch_[j];
      acc_[band_[id]] += sampling::weight(scratch_[j]);
    }
  }
  for (int e = computed_ + 1; e <= b; ++e) weight_[e] = acc_[e];
  computed_ = b;
}

int64_t CandidateBands::token_weight(uint64_t key) const {
  const uint32_t id = static_cast<uint32_t>(key & 0xffffffffu);
  return band_[id] >= cpu::kWeightlessBand ? 0 : sampling::weight(probs_[id]);
}

int64_t CandidateBands::weight_of(const Prefix& p) {
  if (p.weight >= 0) return p.weight;
  const int last_weighing = cpu::kWeightlessBand - 1;
  const bool whole = p.band > last_weighing || p.rank == count_[p.band];
  const int through = std::min(p.band - (whole ? 0 : 1), last_weighing);
  compute_through(p.band);
  int64_t w = 0;
  for (int b = 0; b <= through; ++b) w += weight_[b];
  if (!whole) {
    const std::vector<uint64_t>& keys = sorted_band(p.band);
    for (int64_t r = 0; r < p.rank; ++r) w += token_weight(keys[static_cast<size_t>(r)]);
  }
  return w;
}

CandidateBands::Prefix CandidateBands::first_count(const Prefix& within, int64_t k) {
  int64_t c = 0;
  for (int b = 0; b <= within.band; ++b) {
    if (c + count_[b] >= k) return Prefix{b, k - c, k, -1};
    c += count_[b];
  }
  return within;
}

const std::vector<uint64_t>& CandidateBands::sorted_band(int b) {
  if (sorted_at_[b] >= 0) return sorted_[static_cast<size_t>(sorted_at_[b])];
  sorted_at_[b] = static_cast<int>(sorted_.size());
  sorted_.emplace_back();
  std::vector<uint64_t>& keys = sorted_.back();
  keys.resize(static_cast<size_t>(count_[b]));
  ids_.resize(static_cast<size_t>(vocab_));
  const int64_t m = cpu::band_members(band_.data(), vocab_, b, b, ids_.data());
  for (int64_t k = 0; k < m; ++k) keys[k] = sampling::candidate_key(logits_[ids_[k]], static_cast<uint32_t>(ids_[k]));
  sorter_.sort_keys(&keys);
  return keys;
}

CandidateBands::Prefix CandidateBands::through(uint64_t key) {
  Prefix p;
  p.band = band_[key & 0xffffffffu];
  for (int e = 0; e < p.band; ++e) p.count += count_[e];
  const std::vector<uint64_t>& keys = sorted_band(p.band);
  p.rank = std::lower_bound(keys.begin(), keys.end(), key) - keys.begin() + 1;
  p.count += p.rank;
  p.weight = weight_of(p);
  return p;
}

bool CandidateBands::contains(const Prefix& p, int64_t id) {
  const int b = band_[static_cast<size_t>(id)];
  if (b != p.band) return b < p.band;
  if (p.rank == count_[b]) return true;
  return sampling::candidate_key(logits_[id], static_cast<uint32_t>(id)) <= last_key(p);
}

}  // namespace shardlm
