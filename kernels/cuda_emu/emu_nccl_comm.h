// The emulated NCCL's communicator, shared by its two halves (internal to kernels/cuda_emu):
// emu_nccl_init.cpp (ids, init, state, errors) and emu_nccl_ops.cpp (groups, collectives,
// point-to-point). See nccl.h for the model.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nccl.h"

namespace shardlm_emu::nccl {

// What a member tells the id's maker at init.
struct Hello {
  uint64_t serial;
  int32_t maker, rank, nranks, world, device;
  char host[64];
};

struct ncclComm {
  enum class State { Joining, Ready, Failed, Aborted };
  State state = State::Joining;
  ncclResult_t error = ncclSuccess;
  std::string last_error;
  int nranks = 0, rank = 0, maker = 0, device = 0;
  uint64_t serial = 0;
  Hello mine{};
  MPI_Request hello_req = MPI_REQUEST_NULL;
  std::vector<MPI_Request> reply_reqs;
  std::vector<std::vector<char>> reply_bufs;
  std::vector<int> world;  // members' world ranks by rank
  MPI_Comm mpi = MPI_COMM_NULL;

  void fail(ncclResult_t r, const std::string& text) {
    if (state == State::Failed || state == State::Aborted) return;
    state = State::Failed;
    error = r;
    last_error = text;
  }
};

// Records text for ncclGetLastError(NULL) and returns r.
ncclResult_t fail_call(ncclResult_t r, const std::string& text);
std::string mpi_text(int rc);

}  // namespace shardlm_emu::nccl
