#include "arch/expert_wire.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/wire_bf16.h"
#include "cpu/wire_fp8.h"
#include "parallel/communicator.h"

namespace shardlm {

namespace {

constexpr int kSendWire = Scratch::kFeedForward + 38, kRecvWire = Scratch::kFeedForward + 39;

// Never null, even for no element: the NCCL communicator tells device from host memory by the pointer.
template <typename T>
T* wire_buffer(Scratch& s, int slot, int64_t n) {
  return s.get_as<T>(slot, static_cast<size_t>(std::max<int64_t>(n, 1)));
}

size_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t n = 0;
  for (size_t r = 0; r < counts.size(); ++r) n = std::max(n, displs[r] + counts[r]);
  return n;
}

// Counts or displacements in floats of whole rows, as bytes of packed fp8 rows.
std::vector<size_t> fp8_bytes(const std::vector<size_t>& floats, int64_t row_len) {
  const auto len = static_cast<size_t>(row_len), row_bytes = static_cast<size_t>(cpu::wire_fp8_row_bytes(row_len));
  std::vector<size_t> bytes(floats.size());
  for (size_t r = 0; r < floats.size(); ++r) {
    SHARDLM_CHECK(floats[r] % len == 0, "wire: " << floats[r] << " floats are not rows of " << row_len);
    bytes[r] = floats[r] / len * row_bytes;
  }
  return bytes;
}

}  // namespace

ExpertWire parse_expert_wire(const std::string& name) {
  if (name == "fp32") return ExpertWire::kF32;
  if (name == "bf16") return ExpertWire::kBf16;
  if (name == "fp8") return ExpertWire::kFp8;
  SHARDLM_FAIL("--ep-wire " << name << ": expected fp32, bf16 or fp8");
}

const char* expert_wire_name(ExpertWire w) {
  switch (w) {
    case ExpertWire::kBf16:
      return "bf16";
    case ExpertWire::kFp8:
      return "fp8";
    default:
      return "fp32";
  }
}

ExpertWire combine_wire(ExpertWire w) { return w == ExpertWire::kFp8 ? ExpertWire::kBf16 : w; }

int64_t wire_block_bytes(ExpertWire w, int64_t block_len, int64_t round_len, int64_t row_len) {
  switch (w) {
    case ExpertWire::kBf16:
      return cpu::wire_bf16_len(block_len, round_len) * static_cast<int64_t>(sizeof(uint16_t));
    case ExpertWire::kFp8:
      return cpu::wire_fp8_bytes(block_len, round_len, row_len);
    default:
      return block_len * static_cast<int64_t>(sizeof(float));
  }
}

void wire_all_to_allv(Communicator& c, Scratch& scratch, ExpertWire w, int64_t row_len, const float* send,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs, float* recv,
                      const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs) {
  if (w == ExpertWire::kF32) {
    c.all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, CommDType::kF32);
    return;
  }
  // Every row packed: one block of them, so a peer's rows stay contiguous on the wire.
  const auto n_send = static_cast<int64_t>(extent(send_counts, send_displs));
  const auto n_recv = static_cast<int64_t>(extent(recv_counts, recv_displs));
  ComputeBackend& b = scratch.backend();
  if (w == ExpertWire::kBf16) {
    uint16_t* send_w = wire_buffer<uint16_t>(scratch, kSendWire, n_send);
    uint16_t* recv_w = wire_buffer<uint16_t>(scratch, kRecvWire, n_recv);
    b.pack_bf16(send, 1, n_send, n_send, send_w);
    c.all_to_allv(send_w, send_counts, send_displs, recv_w, recv_counts, recv_displs, CommDType::kBF16);
    b.unpack_bf16(recv_w, 1, n_recv, n_recv, recv);
    return;
  }
  SHARDLM_CHECK(row_len > 0 && n_send % row_len == 0 && n_recv % row_len == 0,
                "wire: " << n_send << " and " << n_recv << " floats are not rows of " << row_len);
  uint8_t* send_w = wire_buffer<uint8_t>(scratch, kSendWire, cpu::wire_fp8_bytes(n_send, n_send, row_len));
  uint8_t* recv_w = wire_buffer<uint8_t>(scratch, kRecvWire, cpu::wire_fp8_bytes(n_recv, n_recv, row_len));
  b.pack_fp8(send, 1, n_send, n_send, row_len, send_w);
  c.all_to_allv(send_w, fp8_bytes(send_counts, row_len), fp8_bytes(send_displs, row_len), recv_w,
                fp8_bytes(recv_counts, row_len), fp8_bytes(recv_displs, row_len), CommDType::kU8);
  b.unpack_fp8(recv_w, 1, n_recv, n_recv, row_len, recv);
}

void wire_enqueue_all_to_all(Communicator& c, Scratch& scratch, ExpertWire w, const float* send, float* recv,
                             int64_t block_len, int64_t round_len, int64_t row_len, void* stream) {
  if (w == ExpertWire::kF32) {
    c.enqueue_all_to_all(send, recv, static_cast<size_t>(block_len), CommDType::kF32, stream);
    return;
  }
  SHARDLM_CHECK(round_len >= 0 && round_len <= block_len,
                "wire: " << round_len << " rounded floats in a block of " << block_len << " words");
  ComputeBackend& b = scratch.backend();
  const int64_t n = c.size();
  if (w == ExpertWire::kBf16) {
    const int64_t wire = cpu::wire_bf16_len(block_len, round_len);
    uint16_t* send_w = wire_buffer<uint16_t>(scratch, kSendWire, n * wire);
    uint16_t* recv_w = wire_buffer<uint16_t>(scratch, kRecvWire, n * wire);
    b.pack_bf16(send, n, block_len, round_len, send_w);
    c.enqueue_all_to_all(send_w, recv_w, static_cast<size_t>(wire), CommDType::kBF16, stream);
    b.unpack_bf16(recv_w, n, block_len, round_len, recv);
    return;
  }
  SHARDLM_CHECK(row_len > 0 && round_len % row_len == 0,
                "wire: " << round_len << " floats are not rows of " << row_len);
  const int64_t wire = cpu::wire_fp8_bytes(block_len, round_len, row_len);
  uint8_t* send_w = wire_buffer<uint8_t>(scratch, kSendWire, n * wire);
  uint8_t* recv_w = wire_buffer<uint8_t>(scratch, kRecvWire, n * wire);
  b.pack_fp8(send, n, block_len, round_len, row_len, send_w);
  c.enqueue_all_to_all(send_w, recv_w, static_cast<size_t>(wire), CommDType::kU8, stream);
  b.unpack_fp8(recv_w, n, block_len, round_len, row_len, recv);
}

}  // namespace shardlm
