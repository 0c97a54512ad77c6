#include "arch/expert_dispatch.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

void moe_accumulate(float* out, float w, const float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] += w * y[j];
}

void run_experts(Scratch& scratch, const std::vector<ExpertWeights>& experts, int64_t inter, int64_t H,
                 const float* in, const std::vector<int64_t>& offsets, float* out) {
  const int64_t L = static_cast<int64_t>(experts.size());
  SHARDLM_CHECK(static_cast<int64_t>(offsets.size()) == L + 1,
                "run_experts: " << offsets.size() << " offsets for " << L << " experts");
  const int64_t R = offsets[L];
  if (R == 0) return;
  ComputeBackend& b = scratch.backend();
  int64_t most = 0;
  for (int64_t e = 0; e < L; ++e) most = std::max(most, offsets[e + 1] - offsets[e]);
  const size_t bytes = static_cast<size_t>(R * H) * sizeof(float);
  float* x = scratch.get(Scratch::kFeedForward + 4, static_cast<size_t>(R * H));
  float* gate = scratch.get(Scratch::kFeedForward + 5, static_cast<size_t>(most * inter));
  float* up = scratch.get(Scratch::kFeedForward + 6, static_cast<size_t>(most * inter));
  float* y = scratch.get(Scratch::kFeedForward + 7, static_cast<size_t>(R * H));
  b.copy_to_device(x, in, bytes);
  for (int64_t e = 0; e < L; ++e) {
    const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
    if (n == 0) continue;
    const ExpertWeights& w = experts[e];
    b.linear(x + r0 * H, n, w.gate, nullptr, gate);
    b.linear(x + r0 * H, n, w.up, nullptr, up);
    b.silu_mul(gate, up, gate, n * inter);
    b.linear(gate, n, w.down, nullptr, y + r0 * H);
  }
  b.copy_to_host(out, y, bytes);
}

ExpertDispatch::ExpertDispatch(Communicator* ep, int64_t num_experts, int64_t hidden)
    : ep_(ep && ep->size() > 1 ? ep : nullptr), E_(num_experts), H_(hidden) {
  if (ep_) {
    rank_ = ep_->rank();
    size_ = ep_->size();
  }
  SHARDLM_CHECK(E_ > 0 && E_ % size_ == 0,
                "expert dispatch: " << size_ << " expert-parallel ranks do not divide " << E_ << " experts");
  per_rank_ = E_ / size_;
  offsets_.assign(static_cast<size_t>(per_rank_ + 1), 0);
}

float* ExpertDispatch::output() { return output_.data(); }

void ExpertDispatch::dispatch(const float* x, const Routing& r) {
  const auto t0 = Clock::now();
  T_ = r.T;
  const int64_t k = r.k, P = T_ * k, H = H_;
  // This rank's pairs in ascending (expert, token) order (a stable counting sort by expert).
  std::vector<int64_t> start(static_cast<size_t>(E_ + 1), 0);
  for (int64_t i = 0; i < P; ++i) {
    const int32_t e = r.experts[i];
    SHARDLM_CHECK(e >= 0 && e < E_, "expert dispatch: expert " << e << " outside [0, " << E_ << ")");
    ++start[e + 1];
  }
  for (int64_t e = 0; e < E_; ++e) start[e + 1] += start[e];
  pair_token_.resize(static_cast<size_t>(P));
  pair_weight_.resize(static_cast<size_t>(P));
  {
    std::vector<int64_t> cur(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t pos = cur[r.experts[t * k + j]]++;
        pair_token_[pos] = static_cast<int32_t>(t);
        pair_weight_[pos] = r.weights[t * k + j];
      }
    }
  }

  if (!ep_) {
    // Every expert local: gather the rows per expert, in the pair order.
    offsets_.assign(start.begin(), start.end());
    input_.resize(static_cast<size_t>(P * H));
    for (int64_t i = 0; i < P; ++i) std::memcpy(&input_[i * H], x + pair_token_[i] * H, H * sizeof(float));
    output_.resize(input_.size());
    dispatch_bytes = 0;
    dispatch_seconds = since(t0);
    return;
  }

  const int n = size_;
  pairs_to_.assign(static_cast<size_t>(n), 0);
  for (int o = 0; o < n; ++o) pairs_to_[o] = start[(o + 1) * per_rank_] - start[o * per_rank_];

  // Records: one per (token, owner rank), the row then the local expert slots.
  slots_ = std::min(k, per_rank_);
  const int64_t rec_bytes = (H + slots_) * static_cast<int64_t>(sizeof(float));
  std::vector<int64_t> recs_to(static_cast<size_t>(n), 0), recs_from(static_cast<size_t>(n), 0);
  std::vector<int32_t> sorted(static_cast<size_t>(k));
  auto token_experts = [&](int64_t t) {
    std::copy_n(r.experts.data() + t * k, k, sorted.begin());
    std::sort(sorted.begin(), sorted.end());
  };
  for (int64_t t = 0; t < T_; ++t) {
    token_experts(t);
    for (int64_t j = 0; j < k; ++j)
      if (j == 0 || sorted[j] / per_rank_ != sorted[j - 1] / per_rank_) ++recs_to[sorted[j] / per_rank_];
  }
  std::vector<size_t> scount(n), sdispl(n), rcount(n), rdispl(n);
  size_t total = 0;
  for (int o = 0; o < n; ++o) {
    sdispl[o] = total;
    scount[o] = static_cast<size_t>(recs_to[o] * rec_bytes);
    total += scount[o];
  }
  send_rec_.resize(total);
  {
    std::vector<size_t> cur(sdispl);
    for (int64_t t = 0; t < T_; ++t) {
      token_experts(t);
      for (int64_t j = 0; j < k;) {
        const int64_t o = sorted[j] / per_rank_;
        uint8_t* rec = &send_rec_[cur[o]];
        cur[o] += static_cast<size_t>(rec_bytes);
        std::memcpy(rec, x + t * H, H * sizeof(float));
        int32_t* slot = reinterpret_cast<int32_t*>(rec + H * sizeof(float));
        int64_t s = 0;
        for (; j < k && sorted[j] / per_rank_ == o; ++j) slot[s++] = static_cast<int32_t>(sorted[j] - o * per_rank_);
        for (; s < slots_; ++s) slot[s] = -1;
      }
    }
  }
  ep_->all_to_all(recs_to.data(), recs_from.data(), 1, CommDType::kI64);
  size_t rtotal = 0;
  for (int s = 0; s < n; ++s) {
    rdispl[s] = rtotal;
    rcount[s] = static_cast<size_t>(recs_from[s] * rec_bytes);
    rtotal += rcount[s];
  }
  recv_rec_.resize(rtotal);
  ep_->all_to_allv(send_rec_.data(), scount, sdispl, recv_rec_.data(), rcount, rdispl, CommDType::kU8);
  dispatch_bytes = 0;
  for (int o = 0; o < n; ++o)
    if (o != rank_) dispatch_bytes += static_cast<int64_t>(scount[o]);

  // Owner side: rows per local expert, ordered (expert, source rank, record).
  const int64_t L = per_rank_;
  from_cnt_.assign(static_cast<size_t>(n * L), 0);
  auto slots_of = [&](int s, int64_t i) {
    return reinterpret_cast<const int32_t*>(&recv_rec_[rdispl[s] + static_cast<size_t>(i * rec_bytes)] +
                                            H * sizeof(float));
  };
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < recs_from[s]; ++i) {
      const int32_t* slot = slots_of(s, i);
      for (int64_t j = 0; j < slots_ && slot[j] >= 0; ++j) {
        SHARDLM_CHECK(slot[j] < L, "expert dispatch: received local expert " << slot[j] << " of " << L);
        ++from_cnt_[s * L + slot[j]];
      }
    }
  }
  offsets_.assign(static_cast<size_t>(L + 1), 0);
  std::vector<int64_t> cur(static_cast<size_t>(n * L));  // next row of (source, expert)
  for (int64_t e = 0; e < L; ++e) {
    int64_t off = offsets_[e];
    for (int s = 0; s < n; ++s) {
      cur[s * L + e] = off;
      off += from_cnt_[s * L + e];
    }
    offsets_[e + 1] = off;
  }
  pairs_from_.assign(static_cast<size_t>(n), 0);
  for (int s = 0; s < n; ++s)
    for (int64_t e = 0; e < L; ++e) pairs_from_[s] += from_cnt_[s * L + e];
  input_.resize(static_cast<size_t>(offsets_[L] * H));
  output_.resize(input_.size());
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < recs_from[s]; ++i) {
      const float* row = reinterpret_cast<const float*>(&recv_rec_[rdispl[s] + static_cast<size_t>(i * rec_bytes)]);
      const int32_t* slot = slots_of(s, i);
      for (int64_t j = 0; j < slots_ && slot[j] >= 0; ++j)
        std::memcpy(&input_[cur[s * L + slot[j]]++ * H], row, H * sizeof(float));
    }
  }
  dispatch_seconds = since(t0);
}

void ExpertDispatch::combine(float* out) {
  const auto t0 = Clock::now();
  const int64_t H = H_;
  const float* result = output_.data();
  if (ep_) {
    // Results back to their tokens' ranks: per source rank, ordered (local expert, record), which
    // is the source's (expert, token) pair order restricted to this rank's experts.
    const int n = size_;
    const int64_t L = per_rank_;
    std::vector<size_t> scount(n), sdispl(n), rcount(n), rdispl(n);
    size_t stotal = 0, rtotal = 0;
    for (int s = 0; s < n; ++s) {
      sdispl[s] = stotal;
      scount[s] = static_cast<size_t>(pairs_from_[s] * H);
      stotal += scount[s];
      rdispl[s] = rtotal;
      rcount[s] = static_cast<size_t>(pairs_to_[s] * H);
      rtotal += rcount[s];
    }
    send_res_.resize(stotal);
    for (int64_t e = 0; e < L; ++e) {
      int64_t src = offsets_[e];  // rows of expert e, source by source
      for (int s = 0; s < n; ++s) {
        const int64_t c = from_cnt_[s * L + e];
        int64_t before = 0;  // pairs of source s for experts below e
        for (int64_t e2 = 0; e2 < e; ++e2) before += from_cnt_[s * L + e2];
        if (c > 0)
          std::memcpy(&send_res_[sdispl[s] + static_cast<size_t>(before * H)], &output_[src * H],
                      static_cast<size_t>(c * H) * sizeof(float));
        src += c;
      }
    }
    recv_res_.resize(rtotal);
    ep_->all_to_allv(send_res_.data(), scount, sdispl, recv_res_.data(), rcount, rdispl, CommDType::kF32);
    combine_bytes = 0;
    for (int s = 0; s < n; ++s)
      if (s != rank_) combine_bytes += static_cast<int64_t>(scount[s] * sizeof(float));
    result = recv_res_.data();
  } else {
    combine_bytes = 0;
  }
  std::fill(out, out + T_ * H, 0.0f);
  const int64_t P = static_cast<int64_t>(pair_token_.size());
  for (int64_t i = 0; i < P; ++i) moe_accumulate(out + pair_token_[i] * H, pair_weight_[i], result + i * H, H);
  combine_seconds = since(t0);
}

}  // namespace shardlm
