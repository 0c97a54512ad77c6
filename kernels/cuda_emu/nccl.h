// NCCL as the programs built over the emulated CUDA runtime see it: this header stands in for the
// toolkit's <nccl.h> (its directory comes first on the emulated targets' include path), and
// emu_nccl_init.cpp and emu_nccl_ops.cpp implement it over MPI on the emulated device memory, which
// is host memory.
//
// Why: the NCCL communicator (src/parallel/comm_nccl.cpp: the id exchange, the nonblocking init
// waited for with a deadline, grouped sends and receives, async error polling, abort) and
// `--comm nccl` end to end then run on every machine, with several ranks, each on its own emulated
// GPU of an emulated 8-GPU node. A one-GPU machine cannot run them: NCCL refuses two ranks of one
// communicator on one GPU. What only the device shows (NCCL's own transports, NVLink, EFA, speed)
// still needs GPU nodes.
//
// The model, where it differs from NCCL:
//  - the rank that made the unique id must be a member (it collects the others at init);
//  - an operation is started (MPI nonblocking) when it is issued on a stream, or, in a group, at
//    the outermost ncclGroupEnd; the stream is busy until it completes (cudaStreamQuery), and work
//    that the stream orders after it waits for it;
//  - buffers must be emulated device memory (NCCL checks this only with NCCL_CHECK_POINTERS=1);
//  - fp16 and bf16 are moved but not reduced, and ncclAvg is not offered;
//  - two ranks of one communicator on the same host and device are refused at init, as NCCL does.
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

#define NCCL_UNIQUE_ID_BYTES 128

namespace shardlm_emu::nccl {

struct ncclComm;
using ncclComm_t = ncclComm*;

struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclDataType_t {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
};

enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

// The fields a program sets; the rest of NCCL's configuration has no meaning here.
struct ncclConfig_t {
  int blocking;
  int cgaClusterSize, minCTAs, maxCTAs;
  const char* netName;
};
#define NCCL_CONFIG_INITIALIZER \
  { 1, 0, 0, 0, nullptr }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
const char* ncclGetErrorString(ncclResult_t r);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetVersion(int* version);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

}  // namespace shardlm_emu::nccl

// NCCL's names are global; these are in a namespace of their own, so that a program can link them
// beside the real library (through shardlm_core in an NCCL build).
using namespace shardlm_emu::nccl;  // NOLINT(google-global-names-in-headers)
