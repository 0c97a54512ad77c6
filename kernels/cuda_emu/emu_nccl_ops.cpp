// NCCL over MPI for programs on the emulated CUDA runtime (see nccl.h for the model): groups,
// collectives and point-to-point.
//
// Operations are MPI nonblocking operations on the communicator's own MPI communicator, tracked as
// work in flight on their stream (cuda_runtime.h, Pending); an MPI error turns into the
// communicator's async error.
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emu_nccl_comm.h"
#include "nccl.h"

namespace shardlm_emu::nccl {

namespace {

// MPI's type for moving (and, where `reduce`, reducing) elements of t; MPI_DATATYPE_NULL: refused.
MPI_Datatype mpi_type(ncclDataType_t t, bool reduce) {
  switch (t) {
    case ncclInt8:
      return MPI_INT8_T;
    case ncclUint8:
      return MPI_UINT8_T;
    case ncclInt32:
      return MPI_INT32_T;
    case ncclUint32:
      return MPI_UINT32_T;
    case ncclInt64:
      return MPI_INT64_T;
    case ncclUint64:
      return MPI_UINT64_T;
    case ncclFloat32:
      return MPI_FLOAT;
    case ncclFloat64:
      return MPI_DOUBLE;
    case ncclFloat16:
    case ncclBfloat16:
      return reduce ? MPI_DATATYPE_NULL : MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

MPI_Op mpi_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return MPI_SUM;
    case ncclProd:
      return MPI_PROD;
    case ncclMax:
      return MPI_MAX;
    case ncclMin:
      return MPI_MIN;
    case ncclAvg:
      break;
  }
  return MPI_OP_NULL;
}

// Operations started together (one call, or one group on one stream) and what they own.
class InFlight final : public Pending {
 public:
  explicit InFlight(ncclComm* c) : comm_(c) {}
  std::vector<MPI_Request> reqs;
  std::vector<std::vector<char>> scratch;
  bool done() override {
    if (reqs.empty()) return true;
    int flag = 0;
    std::vector<MPI_Status> st(reqs.size());
    const int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, st.data());
    if (rc != MPI_SUCCESS) return failed(rc, st);
    if (flag) reqs.clear();
    return flag != 0;
  }
  void finish() override {
    if (reqs.empty()) return;
    std::vector<MPI_Status> st(reqs.size());
    const int rc = MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), st.data());
    if (rc != MPI_SUCCESS) failed(rc, st);
    reqs.clear();
  }

 private:
  // The communicator's async error, with the first failed request's own error where MPI gives one.
  bool failed(int rc, const std::vector<MPI_Status>& st) {
    if (rc == MPI_ERR_IN_STATUS)
      for (const MPI_Status& s : st)
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
          rc = s.MPI_ERROR;
          break;
        }
    comm_->fail(ncclSystemError, "MPI: " + mpi_text(rc));
    reqs.clear();
    return true;
  }
  ncclComm* comm_;
};

// One operation: starts its MPI requests into `f` (returns an MPI error code).
struct Op {
  ncclComm* comm;
  cudaStream_t stream;
  const char* name;
  std::function<int(InFlight&)> start;
};

struct Group {
  int depth = 0;
  std::vector<Op> ops;
};
Group& group() {
  thread_local Group g;
  return g;
}

// Starts ops (all on one stream) as one piece of work in flight on it: now, or when the graph the
// stream is captured into is replayed.
void issue(std::vector<Op> ops) {
  if (ops.empty()) return;
  const cudaStream_t stream = ops.front().stream;
  shardlm_emu::enqueue(
      stream,
      [ops, stream]() {
        ncclComm* owner = ops.front().comm;
        auto work = std::make_shared<InFlight>(owner);
        for (const Op& op : ops) {
          if (op.comm->state != ncclComm::State::Ready) continue;  // failed since it was issued
          const int rc = op.start(*work);
          if (rc != MPI_SUCCESS) op.comm->fail(ncclSystemError, std::string(op.name) + ": MPI: " + mpi_text(rc));
        }
        add_pending(stream, work, owner);
      },
      ops.front().name);
}

ncclResult_t submit(Op op) {
  if (group().depth > 0) {
    group().ops.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<Op> one;
  one.push_back(std::move(op));
  issue(std::move(one));
  return ncclSuccess;
}

ncclResult_t usable(ncclComm_t c, const char* op) {
  if (c == nullptr) return fail_call(ncclInvalidArgument, std::string(op) + ": comm is NULL");
  if (c->state == ncclComm::State::Joining)
    return fail_call(ncclInvalidUsage, std::string(op) + ": the communicator's init has not completed");
  if (c->state != ncclComm::State::Ready)
    return fail_call(c->error != ncclSuccess ? c->error : ncclInvalidUsage, c->last_error);
  return ncclSuccess;
}

// NCCL's buffers are device memory; here a host buffer would run, so it is refused instead.
ncclResult_t device_buffer(const void* p, size_t bytes, const char* op, const char* which) {
  if (bytes == 0) return ncclSuccess;
  cudaPointerAttributes a{};
  if (p == nullptr || cudaPointerGetAttributes(&a, p) != cudaSuccess ||
      (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged))
    return fail_call(ncclInvalidArgument, std::string(op) + ": " + which + " is not device memory");
  return ncclSuccess;
}

// The element type, and a count that MPI's int counts can carry.
ncclResult_t check_args(ncclDataType_t t, size_t count, bool reduce, const char* op) {
  if (mpi_type(t, reduce) == MPI_DATATYPE_NULL)
    return fail_call(ncclInvalidArgument, std::string(op) + ": datatype " + std::to_string(t) +
                                              (reduce ? " is not reduced by the emulation" : " is unknown"));
  if (count > static_cast<size_t>(INT_MAX))
    return fail_call(ncclInvalidArgument, std::string(op) + ": " + std::to_string(count) +
                                              " elements; the emulation moves at most 2^31 - 1 per call");
  return ncclSuccess;
}

int count_int(size_t n) { return static_cast<int>(n); }

}  // namespace

// ---- Groups ----

ncclResult_t ncclGroupStart() {
  ++group().depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  Group& g = group();
  if (g.depth == 0) return fail_call(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  std::vector<Op> ops = std::move(g.ops);
  g.ops.clear();
  // One piece of work per (stream, communicator), in first-use order: its errors are that
  // communicator's.
  while (!ops.empty()) {
    const cudaStream_t s = ops.front().stream;
    const ncclComm* c = ops.front().comm;
    std::vector<Op> same, rest;
    for (Op& op : ops) (op.stream == s && op.comm == c ? same : rest).push_back(std::move(op));
    issue(std::move(same));
    ops = std::move(rest);
  }
  return ncclSuccess;
}

// ---- Collectives and point-to-point ----

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclAllReduce";
  if (ncclResult_t r = usable(comm, name); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(datatype, count, true, name); r != ncclSuccess) return r;
  if (mpi_op(op) == MPI_OP_NULL)
    return fail_call(ncclInvalidArgument, "ncclAllReduce: op not offered by the emulation");
  const size_t bytes = count * type_bytes(datatype);
  if (ncclResult_t r = device_buffer(sendbuff, bytes, name, "sendbuff"); r != ncclSuccess) return r;
  if (ncclResult_t r = device_buffer(recvbuff, bytes, name, "recvbuff"); r != ncclSuccess) return r;
  return submit({comm, stream, name, [=](InFlight& f) {
                   f.reqs.emplace_back(MPI_REQUEST_NULL);
                   return MPI_Iallreduce(sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff, recvbuff, count_int(count),
                                         mpi_type(datatype, true), mpi_op(op), comm->mpi, &f.reqs.back());
                 }});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclBroadcast";
  if (ncclResult_t r = usable(comm, name); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(datatype, count, false, name); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->nranks)
    return fail_call(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root) + " out of range");
  const size_t bytes = count * type_bytes(datatype);
  if (comm->rank == root)
    if (ncclResult_t r = device_buffer(sendbuff, bytes, name, "sendbuff"); r != ncclSuccess) return r;
  if (ncclResult_t r = device_buffer(recvbuff, bytes, name, "recvbuff"); r != ncclSuccess) return r;
  return submit({comm, stream, name, [=](InFlight& f) {
                   if (comm->rank == root && sendbuff != recvbuff && bytes > 0) std::memmove(recvbuff, sendbuff, bytes);
                   f.reqs.emplace_back(MPI_REQUEST_NULL);
                   return MPI_Ibcast(recvbuff, count_int(count), mpi_type(datatype, false), root, comm->mpi,
                                     &f.reqs.back());
                 }});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclReduceScatter";
  if (ncclResult_t r = usable(comm, name); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(datatype, recvcount, true, name); r != ncclSuccess) return r;
  if (mpi_op(op) == MPI_OP_NULL)
    return fail_call(ncclInvalidArgument, "ncclReduceScatter: op not offered by the emulation");
  const size_t bytes = recvcount * type_bytes(datatype);
  if (ncclResult_t r = device_buffer(sendbuff, bytes * static_cast<size_t>(comm->nranks), name, "sendbuff");
      r != ncclSuccess)
    return r;
  if (ncclResult_t r = device_buffer(recvbuff, bytes, name, "recvbuff"); r != ncclSuccess) return r;
  return submit({comm, stream, name, [=](InFlight& f) {
                   // The input as it is when the operation starts (NCCL's in-place form overlaps it).
                   f.scratch.emplace_back(
                       static_cast<const char*>(sendbuff),
                       static_cast<const char*>(sendbuff) + bytes * static_cast<size_t>(comm->nranks));
                   f.reqs.emplace_back(MPI_REQUEST_NULL);
                   return MPI_Ireduce_scatter_block(f.scratch.back().data(), recvbuff, count_int(recvcount),
                                                    mpi_type(datatype, true), mpi_op(op), comm->mpi, &f.reqs.back());
                 }});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclAllGather";
  if (ncclResult_t r = usable(comm, name); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(datatype, sendcount, false, name); r != ncclSuccess) return r;
  const size_t bytes = sendcount * type_bytes(datatype);
  if (ncclResult_t r = device_buffer(sendbuff, bytes, name, "sendbuff"); r != ncclSuccess) return r;
  if (ncclResult_t r = device_buffer(recvbuff, bytes * static_cast<size_t>(comm->nranks), name, "recvbuff");
      r != ncclSuccess)
    return r;
  return submit({comm, stream, name, [=](InFlight& f) {
                   const bool in_place = sendbuff == static_cast<const char*>(recvbuff) + bytes * comm->rank;
                   f.reqs.emplace_back(MPI_REQUEST_NULL);
                   const MPI_Datatype t = mpi_type(datatype, false);
                   return MPI_Iallgather(in_place ? MPI_IN_PLACE : sendbuff, count_int(sendcount), t, recvbuff,
                                         count_int(sendcount), t, comm->mpi, &f.reqs.back());
                 }});
}

// NCCL pairs a pair's sends and receives in issue order; so does MPI on one tag.
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const char* name = "ncclSend";
  if (ncclResult_t r = usable(comm, name); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(datatype, count, false, name); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks)
    return fail_call(ncclInvalidArgument, "ncclSend: peer " + std::to_string(peer) + " out of range");
  if (ncclResult_t r = device_buffer(sendbuff, count * type_bytes(datatype), name, "sendbuff"); r != ncclSuccess)
    return r;
  return submit({comm, stream, name, [=](InFlight& f) {
                   f.reqs.emplace_back(MPI_REQUEST_NULL);
                   return MPI_Isend(sendbuff, count_int(count), mpi_type(datatype, false), peer, 0, comm->mpi,
                                    &f.reqs.back());
                 }});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const char* name = "ncclRecv";
  if (ncclResult_t r = usable(comm, name); r != ncclSuccess) return r;
  if (ncclResult_t r = check_args(datatype, count, false, name); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks)
    return fail_call(ncclInvalidArgument, "ncclRecv: peer " + std::to_string(peer) + " out of range");
  if (ncclResult_t r = device_buffer(recvbuff, count * type_bytes(datatype), name, "recvbuff"); r != ncclSuccess)
    return r;
  return submit({comm, stream, name, [=](InFlight& f) {
                   f.reqs.emplace_back(MPI_REQUEST_NULL);
                   return MPI_Irecv(recvbuff, count_int(count), mpi_type(datatype, false), peer, 0, comm->mpi,
                                    &f.reqs.back());
                 }});
}

}  // namespace shardlm_emu::nccl
