// test_comm_timeout OP TIMEOUT_S [BACKEND], under mpiexec -np 2: ranks 0 and 1 make the group
// "pair(0,1)" on BACKEND (mpi, the default, or fabric); rank 0 starts OP (all_reduce, recv or
// send_recv) and rank 1 never takes part. OP "create": rank 1 never comes to make the group, and
// rank 0's creation times out; OP "node_local" / "line_queue": rank 1 never comes to the world
// collective of node_local() / LineQueue's construction. Rank 0 must throw
// Error within [TIMEOUT_S, TIMEOUT_S + 3 s]; it prints "TIMEOUT_TEST_OK elapsed=X s: <message>"
// (or TIMEOUT_TEST_BAD) and then aborts the job the way shardlm's top level does, which also
// ends rank 1. Expected outcome: non-zero exit and the OK line (checked by run_expect.cmake).
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/line_queue.h"
#include "parallel/node_local.h"
#include "parallel/mpi_env.h"

using namespace shardlm;

namespace {

// Rank 1's part: it never joins, and the abort from rank 0 ends this process. Fails loudly if not.
int never_join(double timeout) {
  std::this_thread::sleep_for(std::chrono::duration<double>(timeout + 20));
  std::printf("TIMEOUT_TEST_BAD: rank 1 was not aborted\n");
  std::fflush(stdout);
  return 1;
}

// Rank 0's part: `call` must throw Error within [timeout, timeout + 3 s]; prints the verdict and
// aborts the job as shardlm's top level does. `returned`: what it means if the call returns.
template <typename Call>
[[noreturn]] void expect_timeout(double timeout, Call call, const std::string& returned) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    call();
    std::printf("TIMEOUT_TEST_BAD: %s\n", returned.c_str());
  } catch (const Error& e) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool ok = elapsed >= timeout && elapsed <= timeout + 3;
    std::printf("%s elapsed=%.2f s: %s\n", ok ? "TIMEOUT_TEST_OK" : "TIMEOUT_TEST_BAD", elapsed, e.what());
  }
  std::fflush(stdout);
  MpiEnv::abort_job("timeout test done", 3);
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnv mpi(&argc, &argv);
  if (argc < 3 || argc > 4 || MpiEnv::size() != 2) {
    std::fprintf(stderr,
                 "usage: mpiexec -np 2 test_comm_timeout all_reduce|recv|send_recv|create|node_local|line_queue "
                 "TIMEOUT_S [mpi|fabric]\n");
    return 2;
  }
  const std::string op = argv[1];
  const double timeout = std::atof(argv[2]);
  const std::string backend = argc == 4 ? argv[3] : "mpi";
  if (op == "create") {
    if (MpiEnv::rank() == 1) return never_join(timeout);
    expect_timeout(
        timeout,
        [&] {
          make_communicator(backend, {0, 1}, "pair(0,1)", timeout);
        },
        "the group was made without rank 1");
  }
  if (op == "node_local" || op == "line_queue") {
    if (MpiEnv::rank() == 1) return never_join(timeout);
    expect_timeout(
        timeout,
        [&] {
          if (op == "node_local")
            node_local(timeout);
          else
            LineQueue(16, 0, 2, timeout);
        },
        op + " finished without rank 1");
  }
  auto comm = make_communicator(backend, {0, 1}, "pair(0,1)", timeout);
  comm->barrier();  // both members are up
  if (MpiEnv::rank() == 1) return never_join(timeout);
  std::vector<float> buf(1000, 1.f), other(1000, 0.f);
  expect_timeout(
      timeout,
      [&] {
        if (op == "all_reduce")
          comm->all_reduce(buf.data(), buf.size(), CommDType::kF32, ReduceOp::kSum);
        else if (op == "recv")
          comm->recv(buf.data(), buf.size(), CommDType::kF32, 1, 3);
        else if (op == "send_recv")
          comm->send_recv(buf.data(), buf.size(), 1, other.data(), other.size(), 1, CommDType::kF32, 3);
        else
          MpiEnv::abort_job("unknown op " + op);
      },
      op + " returned");
}
