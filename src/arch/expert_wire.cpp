#include "arch/expert_wire.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/wire_bf16.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

constexpr int kSendWire = Scratch::kFeedForward + 38, kRecvWire = Scratch::kFeedForward + 39;

// Never null, even for no element: the NCCL communicator tells device from host memory by the pointer.
uint16_t* wire_buffer(Scratch& s, int slot, int64_t halves) {
  return s.get_as<uint16_t>(slot, static_cast<size_t>(std::max<int64_t>(halves, 1)));
}

}  // namespace

ExpertWire parse_expert_wire(const std::string& name) {
  if (name == "fp32") return ExpertWire::kF32;
  if (name == "bf16") return ExpertWire::kBf16;
  SHARDLM_FAIL("--ep-wire " << name << ": expected fp32 or bf16");
}

const char* expert_wire_name(ExpertWire w) { return w == ExpertWire::kBf16 ? "bf16" : "fp32"; }

int64_t wire_block_bytes(ExpertWire w, int64_t block_len, int64_t round_len) {
  if (w == ExpertWire::kF32) return block_len * static_cast<int64_t>(sizeof(float));
  return cpu::wire_bf16_len(block_len, round_len) * static_cast<int64_t>(sizeof(uint16_t));
}

void wire_all_to_allv(Communicator& c, Scratch& scratch, ExpertWire w, const float* send,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs, float* recv,
                      const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs) {
  if (w == ExpertWire::kF32) {
    c.all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, CommDType::kF32);
    return;
  }
  // Every float rounded: one block of them, so the displacements stay the same in 16-bit values.
  size_t send_n = 0, recv_n = 0;
  for (size_t r = 0; r < send_counts.size(); ++r) send_n = std::max(send_n, send_displs[r] + send_counts[r]);
  for (size_t r = 0; r < recv_counts.size(); ++r) recv_n = std::max(recv_n, recv_displs[r] + recv_counts[r]);
  ComputeBackend& b = scratch.backend();
  uint16_t* send_w = wire_buffer(scratch, kSendWire, static_cast<int64_t>(send_n));
  uint16_t* recv_w = wire_buffer(scratch, kRecvWire, static_cast<int64_t>(recv_n));
  const auto n_send = static_cast<int64_t>(send_n), n_recv = static_cast<int64_t>(recv_n);
  b.pack_bf16(send, 1, n_send, n_send, send_w);
  c.all_to_allv(send_w, send_counts, send_displs, recv_w, recv_counts, recv_displs, CommDType::kBF16);
  b.unpack_bf16(recv_w, 1, n_recv, n_recv, recv);
}

void wire_enqueue_all_to_all(Communicator& c, Scratch& scratch, ExpertWire w, const float* send, float* recv,
                             int64_t block_len, int64_t round_len, void* stream) {
  if (w == ExpertWire::kF32) {
    c.enqueue_all_to_all(send, recv, static_cast<size_t>(block_len), CommDType::kF32, stream);
    return;
  }
  SHARDLM_CHECK(round_len >= 0 && round_len <= block_len,
                "wire: " << round_len << " rounded floats in a block of " << block_len << " words");
  ComputeBackend& b = scratch.backend();
  const int64_t n = c.size(), wire = cpu::wire_bf16_len(block_len, round_len);
  uint16_t* send_w = wire_buffer(scratch, kSendWire, n * wire);
  uint16_t* recv_w = wire_buffer(scratch, kRecvWire, n * wire);
  b.pack_bf16(send, n, block_len, round_len, send_w);
  c.enqueue_all_to_all(send_w, recv_w, static_cast<size_t>(wire), CommDType::kBF16, stream);
  b.unpack_bf16(recv_w, n, block_len, round_len, recv);
}

}  // namespace shardlm
