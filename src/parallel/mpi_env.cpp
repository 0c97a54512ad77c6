#include "parallel/mpi_env.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace shardlm {
namespace {

int g_thread_level = MPI_THREAD_SINGLE;  // what MPI granted
std::thread::id g_main_thread;
int g_rank = 0;  // kept for abort_job, which may run where MPI calls are not allowed
MPI_Comm g_control = MPI_COMM_NULL;

}  // namespace

MpiEnv::MpiEnv(int* argc, char*** argv) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  g_thread_level = provided;
  g_main_thread = std::this_thread::get_id();
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  // Errors come back as codes that our checks turn into messages, not as silent aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_dup(MPI_COMM_WORLD, &g_control);  // every rank is here: MPI_Init_thread just returned
  MPI_Comm_set_errhandler(g_control, MPI_ERRORS_RETURN);
}

MPI_Comm MpiEnv::control_comm() { return initialized() ? g_control : MPI_COMM_NULL; }

MpiEnv::~MpiEnv() {
  if (!initialized()) return;
  if (g_control != MPI_COMM_NULL) MPI_Comm_free(&g_control);
  MPI_Finalize();
}

bool MpiEnv::initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

int MpiEnv::rank() {
  int r = 0;
  if (initialized()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int MpiEnv::size() {
  int s = 1;
  if (initialized()) MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

std::string MpiEnv::error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len)) + " (MPI error " + std::to_string(rc) + ")";
}

std::string MpiEnv::host() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

void MpiEnv::abort_job(const std::string& message, int code) {
  const bool main_thread = std::this_thread::get_id() == g_main_thread;
  const bool may_call_mpi = main_thread || g_thread_level >= MPI_THREAD_SERIALIZED;
  std::fprintf(stderr, "[shardlm] rank %d on %s: %s\n", may_call_mpi ? rank() : g_rank, host().c_str(),
               message.c_str());
  std::fflush(stderr);
  if (!may_call_mpi) _exit(code);
  if (initialized() && size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
  if (!main_thread) _exit(code);  // exit()'s destructors would race the main thread
  std::exit(code);
}

std::string MpiEnv::library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<size_t>(len));
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ',' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace shardlm
