// The MPI environment of this process: init/finalize, rank, host, and the job-wide abort used by
// every fatal error so that no other rank is left waiting in a collective.
#pragma once

#include <mpi.h>

#include <string>

namespace shardlm {

class MpiEnv {
 public:
  // MPI_Init_thread(SERIALIZED): the communicators' watchdog thread may end the job while the
  // main thread waits in libfabric, not in MPI.
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();                        // MPI_Finalize
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  static int rank();
  static int size();
  static std::string host();
  static bool initialized();
  // Prints "[shardlm] rank R on HOST: message" to stderr and ends the whole job (MPI_Abort when
  // MPI is up and the world has more than one rank, else exit). From a thread other than the
  // main one, where MPI did not grant the thread level for that, it exits instead (the launcher
  // ends the other ranks: srun --kill-on-bad-exit, mpirun on a nonzero exit).
  [[noreturn]] static void abort_job(const std::string& message, int code = 1);
  // A duplicate of MPI_COMM_WORLD for the handshakes that come before a communicator exists
  // (comm_mpi.cpp), apart from the world's own messages; MPI_COMM_NULL without an MpiEnv.
  static MPI_Comm control_comm();
  // MPI library version string (first line).
  static std::string library_version();
  // What MPI says an error code means ("MPI_ERR_WIN: invalid window (MPI error 53)").
  static std::string error_text(int rc);
};

}  // namespace shardlm
