#include "arch/expert_exchange.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

constexpr int kRecToken = Scratch::kFeedForward + 30, kPairRow = Scratch::kFeedForward + 31,
              kOffsets = Scratch::kFeedForward + 32, kRowSrc = Scratch::kFeedForward + 33,
              kBackRow = Scratch::kFeedForward + 34, kSendRows = Scratch::kFeedForward + 35,
              kRecvRows = Scratch::kFeedForward + 36, kRows = Scratch::kFeedForward + 37,
              kRowsTwin = Scratch::kFeedForward + 40;

size_t at_least_one(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)); }

}  // namespace

cpu::ExchangeShape exchange_shape(int64_t T, int64_t tp, int64_t ep, int64_t num_experts, int64_t k, int64_t hidden,
                                  double capacity) {
  SHARDLM_CHECK(
      ep >= 1 && num_experts % ep == 0 && tp >= 1 && k >= 1 && hidden >= 1,
      "expert exchange: " << num_experts << " experts over " << ep << " ranks, top-" << k << ", rows of " << hidden);
  cpu::ExchangeShape s;
  s.ep = ep;
  s.L = num_experts / ep;
  s.k = k;
  s.H = hidden;
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
                              int64_t T, cpu::RowShare share, const int32_t* pos, int64_t* counts, int32_t* overflow,
                              ExpertWire wire) {
  SHARDLM_CHECK(ep_ && ep_->size() == shape.ep && shape.ep * shape.L == E_ && shape.H == H_,
                "expert exchange: a shape of " << shape.ep << " x " << shape.L << " experts on a group of "
                                               << (ep_ ? ep_->size() : 0) << " ranks and " << E_ << " experts");
  ComputeBackend& b = scratch.backend();
  shape_ = shape;
  T_ = T;
  wire_ = wire;
  const int64_t ep = shape.ep, H = H_, R = shape.block_rows(), Cc = shape.Cc;
  void* stream = b.current_stream();
  int32_t* rec_token = scratch.get_as<int32_t>(kRecToken, at_least_one(ep * R));
  pair_row_ = scratch.get_as<int32_t>(kPairRow, at_least_one(T * shape.k));
  offsets_ = scratch.get_as<int32_t>(kOffsets, static_cast<size_t>(shape.L + 1));
  int32_t* row_src = scratch.get_as<int32_t>(kRowSrc, at_least_one(ep * Cc));
  int32_t* back_row = scratch.get_as<int32_t>(kBackRow, at_least_one(ep * Cc));
  float* send_rows = scratch.get(kSendRows, at_least_one(ep * R * H));
  float* recv_rows = scratch.get(kRecvRows, at_least_one(ep * R * H));
  input_ = scratch.get(kRows, at_least_one(2 * ep * Cc * H));
  output_ = input_ + ep * Cc * H;
  // The experts' gate and up read the rows' bf16 twin, where the backend's GEMMs read bf16, instead
  // of casting them.
  twin_ = b.wants_bf16_twins() ? scratch.get_as<uint16_t>(kRowsTwin, at_least_one(ep * Cc * H)) : nullptr;

  // The plan writes each block's meta rows, the gather its records' rows (keeping the meta), and
  // one all-to-all moves both: the recv plan reads the meta from the received blocks.
  b.expert_send_plan(shape, ids, T, share, pos, rec_token, send_rows, pair_row_, counts, overflow);
  b.gather_rows(x, H, rec_token, ep * R, send_rows);
  // On a bf16 or fp8 wire the records' rows are packed, the meta rows go whole.
  wire_enqueue_all_to_all(*ep_, scratch, wire_, send_rows, recv_rows, R * H, shape.C * H, H, stream);
  b.expert_recv_plan(shape, recv_rows, offsets_, row_src, back_row);
  // The owner's rows, per local expert; the returned blocks' map stays for combine.
  b.expert_gather(recv_rows, H, 1, row_src, offsets_ + shape.L, ep * Cc, {input_, twin_});
}

void ExpertExchange::combine(Scratch& scratch, const int32_t* ids, const float* weights, float* out) {
  ComputeBackend& b = scratch.backend();
  const int64_t ep = shape_.ep, H = H_, Cc = shape_.Cc;
  void* stream = b.current_stream();
  const int32_t* back_row = scratch.get_as<int32_t>(kBackRow, at_least_one(ep * Cc));
  // The results gathered straight onto the wire (a block holds rows only) and summed off it.
  const ExpertWire wire = combine_wire(wire_);
  const void* back = wire_enqueue_rows_all_to_all(*ep_, scratch, wire, output_, H, back_row, Cc, stream);
  if (T_ > 0) expert_combine_wire(b, wire, back, H, ids, weights, pair_row_, T_, shape_.k, out);
}

int64_t ExpertExchange::dispatch_bytes() const {
  return (shape_.ep - 1) * wire_block_bytes(wire_, shape_.block_rows() * H_, shape_.C * H_, H_);
}
int64_t ExpertExchange::combine_bytes() const {
  return (shape_.ep - 1) * wire_block_bytes(combine_wire(wire_), shape_.Cc * H_, shape_.Cc * H_, H_);
}

}  // namespace shardlm
