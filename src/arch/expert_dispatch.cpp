#include "arch/expert_dispatch.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Scratch slots (see the header). The outgoing and incoming row buffers of the dispatch are dead
// once the owner has gathered its input, so the combine's result rows reuse them.
constexpr int kSendRows = Scratch::kFeedForward + 20, kRecvRows = Scratch::kFeedForward + 21,
              kInput = Scratch::kFeedForward + 22, kOutput = Scratch::kFeedForward + 23,
              kSendIndex = Scratch::kFeedForward + 24, kInputIndex = Scratch::kFeedForward + 25,
              kResultIndex = Scratch::kFeedForward + 26, kTokenStart = Scratch::kFeedForward + 27,
              kTokenPairs = Scratch::kFeedForward + 28, kTokenWeights = Scratch::kFeedForward + 29,
              kInputTwin = Scratch::kFeedForward + 41;

// Backend buffers are never null, even for zero elements: the NCCL communicator tells device from
// host memory by the pointers, and every member must pass the same kind.
float* floats(Scratch& s, int slot, int64_t n) { return s.get(slot, static_cast<size_t>(std::max<int64_t>(n, 1))); }

// A backend buffer of n bytes (rows on the wire), never null.
void* bytes(Scratch& s, int slot, int64_t n) {
  return s.get_as<uint8_t>(slot, static_cast<size_t>(std::max<int64_t>(n, 1)));
}

// Backend copy of a host index array, in `slot`.
template <typename T>
T* upload(Scratch& s, int slot, const std::vector<T>& v) {
  T* d = s.get_as<T>(slot, std::max<size_t>(v.size(), 1));
  s.backend().copy_to_device(d, v.data(), v.size() * sizeof(T));
  return d;
}

// Per-rank counts and displacements of `items[r]` blocks of `width` elements each.
struct Layout {
  std::vector<size_t> counts, displs;
  size_t total = 0;
  Layout(const std::vector<int64_t>& items, int64_t width) : counts(items.size()), displs(items.size()) {
    for (size_t r = 0; r < items.size(); ++r) {
      displs[r] = total;
      counts[r] = static_cast<size_t>(items[r] * width);
      total += counts[r];
    }
  }
};

}  // namespace

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

uint16_t* ExpertDispatch::twin(Scratch& scratch, int64_t rows, int64_t twin_rows) const {
  if (rows > twin_rows || !scratch.backend().wants_bf16_twins()) return nullptr;
  return scratch.get_as<uint16_t>(kInputTwin, static_cast<size_t>(std::max<int64_t>(rows * H_, 1)));
}

void ExpertDispatch::dispatch(Scratch& scratch, const float* x, const Routing& r, ExpertWire wire, int64_t twin_rows) {
  ComputeBackend& b = scratch.backend();
  wire_ = wire;
  b.synchronize();
  const auto t0 = Clock::now();
  T_ = r.T;
  k_ = r.k;
  const int64_t k = k_, P = T_ * k, H = H_;
  SHARDLM_CHECK(static_cast<int64_t>(r.experts.size()) == P && static_cast<int64_t>(r.weights.size()) == P,
                "expert dispatch: routing of " << r.experts.size() << " ids and " << r.weights.size()
                                               << " weights for " << T_ << " tokens x top-" << k);
  SHARDLM_CHECK(P < INT32_MAX, "expert dispatch: " << P << " (token, expert) pairs do not fit int32 row indices");
  // This rank's pairs in ascending (expert, token) order (a stable counting sort by expert).
  std::vector<int64_t> start(static_cast<size_t>(E_ + 1), 0);
  for (int64_t i = 0; i < P; ++i) {
    const int32_t e = r.experts[i];
    SHARDLM_CHECK(e >= 0 && e < E_, "expert dispatch: expert " << e << " outside [0, " << E_ << ")");
    ++start[e + 1];
  }
  for (int64_t e = 0; e < E_; ++e) start[e + 1] += start[e];
  std::vector<int32_t> pair_token(static_cast<size_t>(P));
  std::vector<float> pair_weight(static_cast<size_t>(P));
  {
    std::vector<int64_t> cur(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t pos = cur[r.experts[t * k + j]]++;
        pair_token[pos] = static_cast<int32_t>(t);
        pair_weight[pos] = r.weights[t * k + j];
      }
    }
  }
  // The combine's map: each token's pairs in ascending pair index, which is ascending expert.
  token_pairs_.resize(static_cast<size_t>(P));
  token_weights_.resize(static_cast<size_t>(P));
  {
    std::vector<int64_t> fill(static_cast<size_t>(T_), 0);
    for (int64_t i = 0; i < P; ++i) {
      const int32_t t = pair_token[i];
      const int64_t pos = t * k + fill[t]++;
      token_pairs_[pos] = static_cast<int32_t>(i);
      token_weights_[pos] = pair_weight[i];
    }
  }

  if (!ep_) {
    // Every expert local: gather the rows per expert, in the pair order.
    offsets_.assign(start.begin(), start.end());
    input_ = floats(scratch, kInput, P * H);
    output_ = floats(scratch, kOutput, P * H);
    input_twin_ = twin(scratch, P, twin_rows);
    b.gather_rows(x, H, upload(scratch, kSendIndex, pair_token), P, {input_, input_twin_});
    dispatch_bytes = 0;
    b.synchronize();
    dispatch_seconds = since(t0);
    return;
  }

  const int n = size_;
  const int64_t L = per_rank_;
  pairs_to_.assign(static_cast<size_t>(n), 0);
  for (int o = 0; o < n; ++o) pairs_to_[o] = start[(o + 1) * L] - start[o * L];

  // Records: one per (token, owner rank), in token order per owner: the row (by index) and the
  // local expert slots.
  const int64_t slots = std::min(k, L);
  std::vector<int64_t> recs_to(static_cast<size_t>(n), 0), recs_from(static_cast<size_t>(n), 0);
  std::vector<int32_t> sorted(static_cast<size_t>(k));
  auto token_experts = [&](int64_t t) {
    std::copy_n(r.experts.data() + t * k, k, sorted.begin());
    std::sort(sorted.begin(), sorted.end());
  };
  for (int64_t t = 0; t < T_; ++t) {
    token_experts(t);
    for (int64_t j = 0; j < k; ++j)
      if (j == 0 || sorted[j] / L != sorted[j - 1] / L) ++recs_to[sorted[j] / L];
  }
  const Layout send_recs(recs_to, 1);
  send_rows_.resize(send_recs.total);
  send_slots_.resize(send_recs.total * static_cast<size_t>(slots));
  {
    std::vector<size_t> cur(send_recs.displs);
    for (int64_t t = 0; t < T_; ++t) {
      token_experts(t);
      for (int64_t j = 0; j < k;) {
        const int64_t o = sorted[j] / L;
        const size_t rec = cur[o]++;
        send_rows_[rec] = static_cast<int32_t>(t);
        int32_t* slot = &send_slots_[rec * static_cast<size_t>(slots)];
        int64_t s = 0;
        for (; j < k && sorted[j] / L == o; ++j) slot[s++] = static_cast<int32_t>(sorted[j] - o * L);
        for (; s < slots; ++s) slot[s] = -1;
      }
    }
  }
  ep_->all_to_all(recs_to.data(), recs_from.data(), 1, CommDType::kI64);
  const Layout recv_recs(recs_from, 1);
  SHARDLM_CHECK(recv_recs.total < INT32_MAX,
                "expert dispatch: " << recv_recs.total << " received records do not fit int32 row indices");

  // The rows, in backend memory, gathered straight onto the wire; the slots, on the host.
  const int64_t row_bytes = wire_row_bytes(wire_, H);
  void* send_x = bytes(scratch, kSendRows, static_cast<int64_t>(send_recs.total) * row_bytes);
  pack_wire_rows(b, wire_, x, H, upload(scratch, kSendIndex, send_rows_), static_cast<int64_t>(send_recs.total),
                 send_x);
  void* recv_x = bytes(scratch, kRecvRows, static_cast<int64_t>(recv_recs.total) * row_bytes);
  wire_rows_all_to_allv(*ep_, wire_, H, send_x, send_recs.counts, send_recs.displs, recv_x, recv_recs.counts,
                        recv_recs.displs);
  recv_slots_.resize(recv_recs.total * static_cast<size_t>(slots));
  const Layout send_s(recs_to, slots), recv_s(recs_from, slots);
  ep_->all_to_allv(send_slots_.data(), send_s.counts, send_s.displs, recv_slots_.data(), recv_s.counts,
                   recv_s.displs, CommDType::kI32);
  dispatch_bytes = 0;
  for (int o = 0; o < n; ++o)
    if (o != rank_)
      dispatch_bytes += recs_to[o] * (wire_block_bytes(wire_, H, H, H) + slots * int64_t{sizeof(int32_t)});

  // Owner side: rows per local expert, ordered (expert, source rank, record).
  from_cnt_.assign(static_cast<size_t>(n * L), 0);
  auto slots_of = [&](size_t rec) { return &recv_slots_[rec * static_cast<size_t>(slots)]; };
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < recs_from[s]; ++i) {
      const int32_t* slot = slots_of(recv_recs.displs[s] + static_cast<size_t>(i));
      for (int64_t j = 0; j < slots && slot[j] >= 0; ++j) {
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
  const int64_t R = offsets_[L];
  SHARDLM_CHECK(R < INT32_MAX, "expert dispatch: " << R << " expert rows do not fit int32 row indices");
  input_rows_.resize(static_cast<size_t>(R));
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < recs_from[s]; ++i) {
      const size_t rec = recv_recs.displs[s] + static_cast<size_t>(i);
      const int32_t* slot = slots_of(rec);
      for (int64_t j = 0; j < slots && slot[j] >= 0; ++j)
        input_rows_[cur[s * L + slot[j]]++] = static_cast<int32_t>(rec);
    }
  }
  input_ = floats(scratch, kInput, R * H);
  output_ = floats(scratch, kOutput, R * H);
  input_twin_ = twin(scratch, R, twin_rows);
  // Read back off the wire as they are gathered per expert.
  unpack_wire_rows(b, wire_, recv_x, H, upload(scratch, kInputIndex, input_rows_), R, {input_, input_twin_});
  b.synchronize();
  dispatch_seconds = since(t0);
}

void ExpertDispatch::combine(Scratch& scratch, float* out, int64_t out_rows, int64_t first) {
  ComputeBackend& b = scratch.backend();
  b.synchronize();
  const auto t0 = Clock::now();
  SHARDLM_CHECK(first >= 0 && first + T_ <= out_rows,
                "expert dispatch: " << T_ << " tokens from row " << first << " of " << out_rows);
  SHARDLM_CHECK(out_rows < INT32_MAX, "expert dispatch: " << out_rows << " output rows");
  const int64_t H = H_, k = k_, P = T_ * k;
  const void* result = output_;
  ExpertWire result_wire = ExpertWire::kF32;
  combine_bytes = 0;
  if (ep_) {
    // Results back to their tokens' ranks: per source rank, ordered (local expert, record), which
    // is the source's (expert, token) pair order restricted to this rank's experts.
    const int n = size_;
    const int64_t L = per_rank_;
    std::vector<int64_t> row0(static_cast<size_t>(n * L));  // first row of (source, expert)
    for (int64_t e = 0; e < L; ++e) {
      int64_t off = offsets_[e];
      for (int s = 0; s < n; ++s) {
        row0[s * L + e] = off;
        off += from_cnt_[s * L + e];
      }
    }
    result_rows_.resize(static_cast<size_t>(offsets_[L]));
    size_t pos = 0;
    for (int s = 0; s < n; ++s)
      for (int64_t e = 0; e < L; ++e)
        for (int64_t c = 0; c < from_cnt_[s * L + e]; ++c)
          result_rows_[pos++] = static_cast<int32_t>(row0[s * L + e] + c);
    const Layout send_p(pairs_from_, 1), recv_p(pairs_to_, 1);
    SHARDLM_CHECK(static_cast<int64_t>(recv_p.total) == P,
                  "expert dispatch: " << recv_p.total << " results due for " << P << " pairs");
    // Gathered straight onto the wire; the sum below reads them off it.
    result_wire = combine_wire(wire_);
    const int64_t row_bytes = wire_row_bytes(result_wire, H);
    void* send_res = bytes(scratch, kSendRows, static_cast<int64_t>(send_p.total) * row_bytes);
    pack_wire_rows(b, result_wire, output_, H, upload(scratch, kResultIndex, result_rows_),
                   static_cast<int64_t>(result_rows_.size()), send_res);
    void* recv_res = bytes(scratch, kRecvRows, P * row_bytes);
    wire_rows_all_to_allv(*ep_, result_wire, H, send_res, send_p.counts, send_p.displs, recv_res, recv_p.counts,
                          recv_p.displs);
    for (int s = 0; s < n; ++s)
      if (s != rank_) combine_bytes += static_cast<int64_t>(send_p.counts[s]) * row_bytes;
    result = recv_res;
  }
  // Token first + t sums its pairs [t * k, (t + 1) * k) of token_pairs_; the other rows are empty.
  token_start_.resize(static_cast<size_t>(out_rows + 1));
  for (int64_t u = 0; u <= out_rows; ++u)
    token_start_[u] = static_cast<int32_t>(std::clamp<int64_t>(u - first, 0, T_) * k);
  combine_wire_rows(b, result_wire, result, H, upload(scratch, kTokenStart, token_start_),
                    upload(scratch, kTokenPairs, token_pairs_), upload(scratch, kTokenWeights, token_weights_),
                    out_rows, out);
  b.synchronize();
  combine_seconds = since(t0);
}

}  // namespace shardlm
