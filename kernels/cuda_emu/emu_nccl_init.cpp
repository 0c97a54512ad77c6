// NCCL over MPI for programs on the emulated CUDA runtime (see nccl.h for the model): unique ids,
// communicator init, state and errors.
//
// Init: the unique id names its maker's world rank and a serial number. Every other member sends
// the maker a hello (its rank, the size it expects, its world rank, host and device) on
// MPI_COMM_WORLD; the maker checks them (each rank once, one size, no two ranks on one host's
// device) and answers each with the member list or the error, and the members then make an MPI
// communicator of their own (MPI_Comm_create_group). All of it advances in polls
// (ncclCommGetAsyncError), so a nonblocking init that a member never joins stays in progress and
// the caller's deadline reports it.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emu_nccl_comm.h"
#include "nccl.h"

namespace shardlm_emu::nccl {

namespace {

// Init messages travel on MPI_COMM_WORLD with these tags. The program's own messages there use
// other tags, and every init message to a rank is received before that rank's init of its group
// completes, so none is left for the program's later any-tag receives (replica results).
constexpr int kHelloTag = 32001, kReplyTag = 32002;
constexpr uint64_t kMagic = 0x31554d454c43434eull;  // "NCCLEMU1"

struct IdFields {
  uint64_t magic;
  int32_t maker;  // world rank
  int32_t pad;
  uint64_t serial;
};
static_assert(sizeof(IdFields) <= NCCL_UNIQUE_ID_BYTES, "id fields fit the unique id");

struct ReplyHead {
  uint64_t serial;
  int32_t maker, status;
  char text[256];
};

bool mpi_ready() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::string host_name() {
  char h[64] = {};
  gethostname(h, sizeof h - 1);
  return h;
}

// Init messages received but not yet claimed, by (maker, serial): hellos at a maker, the reply at
// a member.
struct Mailbox {
  std::map<std::pair<int, uint64_t>, std::vector<Hello>> hellos;
  std::map<std::pair<int, uint64_t>, std::vector<char>> replies;
};
Mailbox& mailbox() {
  static Mailbox m;
  return m;
}

void drain_mailbox() {
  for (int tag : {kHelloTag, kReplyTag}) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &flag, &st);
      if (!flag) break;
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      std::vector<char> buf(static_cast<size_t>(n));
      MPI_Recv(buf.data(), n, MPI_BYTE, st.MPI_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (tag == kHelloTag && buf.size() == sizeof(Hello)) {
        Hello h;
        std::memcpy(&h, buf.data(), sizeof h);
        mailbox().hellos[{h.maker, h.serial}].push_back(h);
      } else if (tag == kReplyTag && buf.size() >= sizeof(ReplyHead)) {
        ReplyHead r;
        std::memcpy(&r, buf.data(), sizeof r);
        mailbox().replies[{r.maker, r.serial}] = std::move(buf);
      }
    }
  }
}

// The maker: once every member's hello is in, the checks and the replies.
void maker_step(ncclComm& c) {
  const auto key = std::make_pair(c.maker, c.serial);
  auto it = mailbox().hellos.find(key);
  const size_t have = it == mailbox().hellos.end() ? 0 : it->second.size();
  if (have + 1 < static_cast<size_t>(c.nranks)) return;
  std::vector<Hello> all = it == mailbox().hellos.end() ? std::vector<Hello>{} : it->second;
  mailbox().hellos.erase(key);
  all.push_back(c.mine);
  std::vector<int> world(static_cast<size_t>(c.nranks), -1);
  std::vector<const Hello*> by_rank(static_cast<size_t>(c.nranks), nullptr);
  ncclResult_t status = ncclSuccess;
  std::string text;
  for (const Hello& h : all) {
    if (h.nranks != c.nranks || h.rank < 0 || h.rank >= c.nranks || by_rank[static_cast<size_t>(h.rank)] != nullptr) {
      status = ncclInvalidUsage;
      text = "world rank " + std::to_string(h.world) + " joined as rank " + std::to_string(h.rank) + " of " +
             std::to_string(h.nranks) + ", which does not fit a communicator of " + std::to_string(c.nranks) + " ranks";
      break;
    }
    by_rank[static_cast<size_t>(h.rank)] = &h;
    world[static_cast<size_t>(h.rank)] = h.world;
  }
  for (int a = 0; status == ncclSuccess && a < c.nranks; ++a)
    for (int b = a + 1; b < c.nranks; ++b) {
      const Hello &x = *by_rank[static_cast<size_t>(a)], &y = *by_rank[static_cast<size_t>(b)];
      if (x.device == y.device && std::strncmp(x.host, y.host, sizeof x.host) == 0) {
        status = ncclInvalidUsage;
        text = "Duplicate GPU detected : rank " + std::to_string(a) + " and rank " + std::to_string(b) +
               " both on CUDA device " + std::to_string(x.device) + " of host " + x.host;
        break;
      }
    }
  ReplyHead head{};
  head.serial = c.serial;
  head.maker = c.maker;
  head.status = status;
  std::strncpy(head.text, text.c_str(), sizeof head.text - 1);
  std::vector<char> msg(sizeof head + world.size() * sizeof(int));
  std::memcpy(msg.data(), &head, sizeof head);
  std::memcpy(msg.data() + sizeof head, world.data(), world.size() * sizeof(int));
  for (const Hello& h : all) {
    if (h.world == c.mine.world) continue;
    c.reply_bufs.push_back(msg);
    c.reply_reqs.emplace_back(MPI_REQUEST_NULL);
    MPI_Isend(c.reply_bufs.back().data(), static_cast<int>(msg.size()), MPI_BYTE, h.world, kReplyTag, MPI_COMM_WORLD,
              &c.reply_reqs.back());
  }
  mailbox().replies[{c.maker, c.serial}] = std::move(msg);  // the maker's own copy
}

// One poll of a joining communicator.
void join_step(ncclComm& c) {
  drain_mailbox();
  if (c.mine.world == c.maker) maker_step(c);
  auto it = mailbox().replies.find({c.maker, c.serial});
  if (it == mailbox().replies.end()) return;
  std::vector<char> msg = std::move(it->second);
  mailbox().replies.erase(it);
  ReplyHead head;
  std::memcpy(&head, msg.data(), sizeof head);
  if (head.status != ncclSuccess) {
    c.fail(static_cast<ncclResult_t>(head.status), head.text);
  } else {
    c.world.assign(static_cast<size_t>(c.nranks), -1);
    std::memcpy(c.world.data(), msg.data() + sizeof head, c.world.size() * sizeof(int));
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, c.nranks, c.world.data(), &group);
    // Every member got the list before it comes here, so this collective completes.
    const int tag = static_cast<int>((static_cast<uint64_t>(c.maker) * 131u + c.serial) % 30000u) + 1;
    const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c.mpi);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS || c.mpi == MPI_COMM_NULL) {
      c.fail(ncclSystemError, "MPI_Comm_create_group failed");
    } else {
      MPI_Comm_set_errhandler(c.mpi, MPI_ERRORS_RETURN);
      c.state = ncclComm::State::Ready;
    }
  }
  if (c.hello_req != MPI_REQUEST_NULL) MPI_Wait(&c.hello_req, MPI_STATUS_IGNORE);
  if (!c.reply_reqs.empty())
    MPI_Waitall(static_cast<int>(c.reply_reqs.size()), c.reply_reqs.data(), MPI_STATUSES_IGNORE);
  c.reply_reqs.clear();
  c.reply_bufs.clear();
}

}  // namespace

thread_local std::string g_last_error;

ncclResult_t fail_call(ncclResult_t r, const std::string& text) {
  g_last_error = text;
  return r;
}

std::string mpi_text(int rc) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, s, &n);
  return std::string(s, static_cast<size_t>(n));
}

// ---- Ids, init, state ----

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return fail_call(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
  if (!mpi_ready()) return fail_call(ncclSystemError, "ncclGetUniqueId: the emulation needs MPI initialised");
  static uint64_t serial = 0;
  IdFields f{kMagic, world_rank(), 0, ++serial};
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, &f, sizeof f);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (comm == nullptr) return fail_call(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail_call(ncclInvalidArgument,
                     "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks");
  IdFields f;
  std::memcpy(&f, id.internal, sizeof f);
  if (f.magic != kMagic) return fail_call(ncclInvalidArgument, "ncclCommInitRank: not a unique id of the emulation");
  if (!mpi_ready()) return fail_call(ncclSystemError, "ncclCommInitRank: the emulation needs MPI initialised");
  auto c = std::make_unique<ncclComm>();
  c->nranks = nranks;
  c->rank = rank;
  c->maker = f.maker;
  c->serial = f.serial;
  cudaGetDevice(&c->device);
  c->mine.serial = f.serial;
  c->mine.maker = f.maker;
  c->mine.rank = rank;
  c->mine.nranks = nranks;
  c->mine.world = world_rank();
  c->mine.device = c->device;
  std::strncpy(c->mine.host, host_name().c_str(), sizeof c->mine.host - 1);
  if (c->mine.world != c->maker)
    MPI_Isend(&c->mine, sizeof(Hello), MPI_BYTE, c->maker, kHelloTag, MPI_COMM_WORLD, &c->hello_req);
  join_step(*c);
  const bool blocking = config == nullptr || config->blocking != 0;
  while (blocking && c->state == ncclComm::State::Joining) join_step(*c);
  *comm = c.release();
  if ((*comm)->state == ncclComm::State::Failed) return fail_call((*comm)->error, (*comm)->last_error);
  return (*comm)->state == ncclComm::State::Joining ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) return fail_call(ncclInvalidArgument, "ncclCommGetAsyncError: NULL");
  if (comm->state == ncclComm::State::Joining) join_step(*comm);
  switch (comm->state) {
    case ncclComm::State::Joining:
      *async_error = ncclInProgress;
      break;
    case ncclComm::State::Ready:
      *async_error = ncclSuccess;
      break;
    default:
      *async_error = comm->error != ncclSuccess ? comm->error : ncclInvalidUsage;
      break;
  }
  return ncclSuccess;
}

// Everything issued is flushed: the operations complete (their streams were synchronised by a
// correct caller already).
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return fail_call(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  drop_pending(comm);
  if (comm->mpi != MPI_COMM_NULL && mpi_ready()) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

// Operations still in flight can neither be completed nor cancelled (MPI cannot cancel a
// collective), so they and the communicator are left to the process's exit.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  drop_pending(comm);
  comm->state = ncclComm::State::Aborted;
  if (comm->error == ncclSuccess) comm->error = ncclInvalidUsage;
  comm->last_error = "the communicator was aborted";
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return fail_call(ncclInvalidArgument, "ncclCommCount: NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return fail_call(ncclInvalidArgument, "ncclCommUserRank: NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string text;
  text = comm != nullptr && !comm->last_error.empty() ? comm->last_error : g_last_error;
  return text.c_str();
}

// 0: not NCCL.
ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail_call(ncclInvalidArgument, "ncclGetVersion: NULL");
  *version = 0;
  return ncclSuccess;
}

}  // namespace shardlm_emu::nccl
