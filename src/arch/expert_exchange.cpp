#include "arch/expert_exchange.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

constexpr int kRecToken = Scratch::kFeedForward + 30, kSendMeta = Scratch::kFeedForward + 31,
              kRecvMeta = Scratch::kFeedForward + 32, kPairRow = Scratch::kFeedForward + 33,
              kOffsets = Scratch::kFeedForward + 34, kRowSrc = Scratch::kFeedForward + 35,
              kBackRow = Scratch::kFeedForward + 36, kSendRows = Scratch::kFeedForward + 37,
              kRecvRows = Scratch::kFeedForward + 38, kRows = Scratch::kFeedForward + 39;

size_t at_least_one(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)); }

}  // namespace

cpu::ExchangeShape exchange_shape(int64_t T, int64_t tp, int64_t ep, int64_t num_experts, int64_t k, double capacity) {
  SHARDLM_CHECK(ep >= 1 && num_experts % ep == 0 && tp >= 1 && k >= 1,
                "expert exchange: " << num_experts << " experts over " << ep << " ranks, top-" << k);
  cpu::ExchangeShape s;
  s.ep = ep;
  s.L = num_experts / ep;
  s.k = k;
  const int64_t S = (T + tp - 1) / tp;
  s.C = S;
  s.Cc = S * s.kl();
  if (capacity > 0) {
    // f x (the mean load of a block + one token's worth), rounded up.
    const double mean = static_cast<double>(S) * static_cast<double>(k) / static_cast<double>(ep);
    auto room = [&](double one, int64_t worst) {
      const double want = std::ceil(capacity * (mean + one));
      return want < static_cast<double>(worst) ? static_cast<int64_t>(want) : worst;
    };
    s.C = room(1.0, s.C);
    s.Cc = room(static_cast<double>(s.kl()), s.Cc);
  }
  return s;
}

ExpertExchange::ExpertExchange(Communicator* ep, int64_t num_experts, int64_t hidden)
    : ep_(ep), E_(num_experts), H_(hidden) {}

void ExpertExchange::dispatch(Scratch& scratch, const cpu::ExchangeShape& shape, const float* x, const int32_t* ids,
                              int64_t T, int64_t t0, int64_t Ts, const int32_t* pos, int64_t* counts,
                              int32_t* overflow) {
  SHARDLM_CHECK(ep_ && ep_->size() == shape.ep && shape.ep * shape.L == E_,
                "expert exchange: a shape of " << shape.ep << " x " << shape.L << " experts on a group of "
                                               << (ep_ ? ep_->size() : 0) << " ranks and " << E_ << " experts");
  ComputeBackend& b = scratch.backend();
  shape_ = shape;
  T_ = T;
  const int64_t ep = shape.ep, H = H_, C = shape.C, Cc = shape.Cc, M = shape.meta();
  void* stream = b.current_stream();
  int32_t* rec_token = scratch.get_as<int32_t>(kRecToken, at_least_one(ep * C));
  int32_t* send_meta = scratch.get_as<int32_t>(kSendMeta, at_least_one(ep * M));
  int32_t* recv_meta = scratch.get_as<int32_t>(kRecvMeta, at_least_one(ep * M));
  pair_row_ = scratch.get_as<int32_t>(kPairRow, at_least_one(T * shape.k));
  offsets_ = scratch.get_as<int32_t>(kOffsets, static_cast<size_t>(shape.L + 1));
  int32_t* row_src = scratch.get_as<int32_t>(kRowSrc, at_least_one(ep * Cc));
  int32_t* back_row = scratch.get_as<int32_t>(kBackRow, at_least_one(ep * Cc));
  float* send_rows = scratch.get(kSendRows, at_least_one(ep * std::max(C, Cc) * H));
  float* recv_rows = scratch.get(kRecvRows, at_least_one(ep * std::max(C, Cc) * H));
  input_ = scratch.get(kRows, at_least_one(2 * ep * Cc * H));
  output_ = input_ + ep * Cc * H;

  b.expert_send_plan(shape, ids, T, t0, Ts, pos, rec_token, send_meta, pair_row_, counts, overflow);
  b.gather_rows(x, H, rec_token, ep * C, send_rows);
  ep_->enqueue_all_to_all(send_meta, recv_meta, static_cast<size_t>(M), CommDType::kI32, stream);
  ep_->enqueue_all_to_all(send_rows, recv_rows, static_cast<size_t>(C * H), CommDType::kF32, stream);
  b.expert_recv_plan(shape, recv_meta, offsets_, row_src, back_row);
  // The owner's rows, per local expert; the returned blocks' map stays for combine.
  b.expert_gather(recv_rows, H, 1, row_src, offsets_ + shape.L, ep * Cc, input_);
}

void ExpertExchange::combine(Scratch& scratch, const int32_t* ids, const float* weights, float* out) {
  ComputeBackend& b = scratch.backend();
  const int64_t ep = shape_.ep, H = H_, C = shape_.C, Cc = shape_.Cc;
  void* stream = b.current_stream();
  // The dispatch's row blocks are used up: the returned blocks go through the same buffers.
  float* send_rows = scratch.get(kSendRows, at_least_one(ep * std::max(C, Cc) * H));
  float* recv_rows = scratch.get(kRecvRows, at_least_one(ep * std::max(C, Cc) * H));
  const int32_t* back_row = scratch.get_as<int32_t>(kBackRow, at_least_one(ep * Cc));
  b.gather_rows(output_, H, back_row, ep * Cc, send_rows);
  ep_->enqueue_all_to_all(send_rows, recv_rows, static_cast<size_t>(Cc * H), CommDType::kF32, stream);
  if (T_ > 0) b.expert_combine(recv_rows, H, ids, weights, pair_row_, T_, shape_.k, out);
}

int64_t ExpertExchange::dispatch_bytes() const {
  return (shape_.ep - 1) * (shape_.C * H_ + shape_.meta()) * static_cast<int64_t>(sizeof(float));
}
int64_t ExpertExchange::combine_bytes() const {
  return (shape_.ep - 1) * shape_.Cc * H_ * static_cast<int64_t>(sizeof(float));
}

}  // namespace shardlm
