// Running the shardlm binary (plainly or under mpirun) from tests, and reading its results back.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/h5_read.h"
#include "common/test_dirs.h"

namespace shardlm::test {

struct Proc {
  int code;
  std::string out;  // stdout and stderr together
};

inline Proc sh(const std::string& cmd) {
  Proc p{0, {}};
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  const int st = pclose(f);
  p.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return p;
}

// The binary under test: shardlm, or shardlm-emulated for the tests built to run the CUDA backend
// over the emulated runtime.
#ifdef SHARDLM_EMULATED_BINARY
inline std::string shardlm_bin() { return SHARDLM_EMULATED_BINARY; }
#else
inline std::string shardlm_bin() { return SHARDLM_BINARY; }
#endif

// "mpirun --oversubscribe -np N" (Open MPI allowed to run as root, as CI does).
inline std::string mpirun(int np) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  // The ranks share the cores with the other tests CTest runs at the same time: a rank waiting in
  // MPI yields its core instead of spinning on it (a tp run's collectives otherwise wait for the
  // spinning peer's time slice).
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  return std::string(SHARDLM_MPIEXEC) + " --oversubscribe -np " + std::to_string(np) + " ";
}

// Starts ARGS (argv[0] a path, no shell) in the background with stderr to LOG; returns its pid.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for PID; its exit code, or 128 + the signal that ended it.
inline int wait_exit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct RunOutput {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<float>> logprobs;
  // The logprobs and prompt_logprobs columns: top alternatives and the prompt's logprobs.
  std::map<std::string, std::vector<int32_t>> top_ids, prompt_top_ids;
  std::map<std::string, std::vector<float>> top_lps, prompt_lps, prompt_top_lps;
  std::map<std::string, std::string> errors;
  std::string kv_dtype;  // the run's resolved --kv-dtype (fp32, bf16 or fp8)
};

inline RunOutput read_run(const std::string& h5) {
  H5Reader h(h5);
  RunOutput r;
  auto ids = h.strings("/requests/id");
  auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
  auto lps = h.lists<float>("/requests/token_logprobs", H5T_NATIVE_FLOAT);
  auto errs = h.strings("/requests/error");
  auto top_ids = h.lists<int32_t>("/requests/top_token_ids", H5T_NATIVE_INT32);
  auto top_lps = h.lists<float>("/requests/top_logprobs", H5T_NATIVE_FLOAT);
  auto prompt_lps = h.lists<float>("/requests/prompt_logprobs", H5T_NATIVE_FLOAT);
  auto prompt_top_ids = h.lists<int32_t>("/requests/prompt_top_token_ids", H5T_NATIVE_INT32);
  auto prompt_top_lps = h.lists<float>("/requests/prompt_top_logprobs", H5T_NATIVE_FLOAT);
  for (size_t i = 0; i < ids.size(); ++i) {
    r.tokens[ids[i]] = outs[i];
    r.logprobs[ids[i]] = lps[i];
    r.errors[ids[i]] = errs[i];
    r.top_ids[ids[i]] = top_ids[i];
    r.top_lps[ids[i]] = top_lps[i];
    r.prompt_lps[ids[i]] = prompt_lps[i];
    r.prompt_top_ids[ids[i]] = prompt_top_ids[i];
    r.prompt_top_lps[ids[i]] = prompt_top_lps[i];
  }
  const std::string config = h.string_attr("config");
  const size_t at = config.find("kv-dtype = ");
  if (at != std::string::npos) r.kv_dtype = config.substr(at + 11, config.find('\n', at) - at - 11);
  return r;
}

}  // namespace shardlm::test
