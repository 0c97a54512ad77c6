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

CommDType wire_dtype(ExpertWire w) {
  switch (w) {
    case ExpertWire::kBf16:
      return CommDType::kBF16;
    case ExpertWire::kFp8:
      return CommDType::kU8;
    default:
      return CommDType::kF32;
  }
}

// Elements of the wire's type (wire_dtype) in a row of H floats.
size_t row_elements(ExpertWire w, int64_t H) {
  return static_cast<size_t>(w == ExpertWire::kFp8 ? cpu::wire_fp8_row_bytes(H) : H);
}

// Counts or displacements in rows as elements of the wire's type.
std::vector<size_t> row_elements(ExpertWire w, const std::vector<size_t>& rows, int64_t H) {
  std::vector<size_t> elements(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) elements[r] = rows[r] * row_elements(w, H);
  return elements;
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

int64_t wire_row_bytes(ExpertWire w, int64_t row_len) { return wire_block_bytes(w, row_len, row_len, row_len); }

void pack_wire_rows(ComputeBackend& b, ExpertWire w, const float* src, int64_t H, const int32_t* rows, int64_t n,
                    void* dst) {
  switch (w) {
    case ExpertWire::kBf16:
      b.pack_rows_bf16(src, H, rows, n, static_cast<uint16_t*>(dst));
      return;
    case ExpertWire::kFp8:
      b.pack_rows_fp8(src, H, rows, n, static_cast<uint8_t*>(dst));
      return;
    default:
      b.gather_rows(src, H, rows, n, static_cast<float*>(dst));
  }
}

void unpack_wire_rows(ComputeBackend& b, ExpertWire w, const void* src, int64_t H, const int32_t* rows, int64_t n,
                      ActivationsOut dst) {
  switch (w) {
    case ExpertWire::kBf16:
      b.unpack_rows_bf16(static_cast<const uint16_t*>(src), H, rows, n, dst);
      return;
    case ExpertWire::kFp8:
      b.unpack_rows_fp8(static_cast<const uint8_t*>(src), H, rows, n, dst);
      return;
    default:
      b.gather_rows(static_cast<const float*>(src), H, rows, n, dst);
  }
}

void combine_wire_rows(ComputeBackend& b, ExpertWire w, const void* y, int64_t H, const int32_t* token_start,
                       const int32_t* rows, const float* weights, int64_t T, float* out) {
  SHARDLM_CHECK(w != ExpertWire::kFp8, "wire: a combine's results do not travel in fp8");
  if (w == ExpertWire::kBf16) {
    b.combine_rows_bf16(static_cast<const uint16_t*>(y), H, token_start, rows, weights, T, out);
  } else {
    b.combine_rows(static_cast<const float*>(y), H, token_start, rows, weights, T, out);
  }
}

void wire_rows_all_to_allv(Communicator& c, ExpertWire w, int64_t H, const void* send,
                           const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs, void* recv,
                           const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs) {
  c.all_to_allv(send, row_elements(w, send_counts, H), row_elements(w, send_displs, H), recv,
                row_elements(w, recv_counts, H), row_elements(w, recv_displs, H), wire_dtype(w));
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

const void* wire_enqueue_rows_all_to_all(Communicator& c, Scratch& scratch, ExpertWire w, const float* src, int64_t H,
                                         const int32_t* rows, int64_t rows_per_block, void* stream) {
  const int64_t n = c.size() * rows_per_block, row_bytes = wire_row_bytes(w, H);
  uint8_t* send_w = wire_buffer<uint8_t>(scratch, kSendWire, n * row_bytes);
  uint8_t* recv_w = wire_buffer<uint8_t>(scratch, kRecvWire, n * row_bytes);
  pack_wire_rows(scratch.backend(), w, src, H, rows, n, send_w);
  c.enqueue_all_to_all(send_w, recv_w, static_cast<size_t>(rows_per_block) * row_elements(w, H), wire_dtype(w), stream);
  return recv_w;
}

void expert_combine_wire(ComputeBackend& b, ExpertWire w, const void* yp, int64_t H, const int32_t* ids,
                         const float* weights, const int32_t* slot_row, int64_t T, int64_t k, float* out) {
  SHARDLM_CHECK(w != ExpertWire::kFp8, "wire: a combine's results do not travel in fp8");
  if (w == ExpertWire::kBf16) {
    b.expert_combine_bf16(static_cast<const uint16_t*>(yp), H, ids, weights, slot_row, T, k, out);
  } else {
    b.expert_combine(static_cast<const float*>(yp), H, ids, weights, slot_row, T, k, out);
  }
}

}  // namespace shardlm
