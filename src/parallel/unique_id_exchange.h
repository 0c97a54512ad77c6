// Bootstrap of a device communicator: group rank 0 makes the 128-byte unique id (ncclGetUniqueId)
// and every member gets it by a broadcast over a host communicator (MPI). Kept apart from NCCL so
// that the exchange is tested on machines without a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

#include "parallel/communicator.h"

namespace shardlm {

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using UniqueIdBytes = std::array<uint8_t, kUniqueIdBytes>;

// Collective over `boot`: make_id runs on group rank 0 only; every member returns its bytes.
UniqueIdBytes exchange_unique_id(Communicator& boot, const std::function<UniqueIdBytes()>& make_id);

}  // namespace shardlm
