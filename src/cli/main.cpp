// shardlm: one binary, started the same way on every rank (mpirun / srun) or plainly.
#include <cstdio>
#include <memory>
#include <cstring>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "core/build_info.h"
#include "core/error.h"
#include "parallel/mpi_env.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  bool needs_mpi;
  const char* help;
};

const Command kCommands[] = {
    {"run", &shardlm::cmd_run, true, "generate for every prompt of a file and write HDF5"},
    {"tokenize", &shardlm::cmd_tokenize, false, "encode text to ids (or --decode ids to text)"},
    {"make-model", &shardlm::cmd_make_model, false,
     "write a random-weight model from a config (inputs/models/; the demo's is tiny-llama)"},
    {"score", &shardlm::cmd_score, true, "write the logits at every position of a token sequence (.npy)"},
    {"bench", &shardlm::cmd_bench, false, "measure prefill and decode tokens/s against the machine's ceilings"},
    {"bench-comm", &shardlm::cmd_bench_comm, true, "measure collective bandwidth and check results (like nccl-tests)"},
    {"bench-moe", &shardlm::cmd_bench_moe, true,
     "time one MoE layer's route, dispatch, expert GEMMs and combine over EP ranks"},
    {"plan", &shardlm::cmd_plan, false, "capacity planning: weights, KV cache and throughput ceilings per layout"},
    {"report", &shardlm::cmd_report, false,
     "summarise a result file: throughput, latency percentiles, ranks (--plots, --json)"},
    {"merge", &shardlm::cmd_merge, false, "merge result files of disjoint prompt shards (a job array) into one"},
};

void usage() {
  std::fprintf(stderr, "shardlm %s (%s): offline batch inference of LLMs, sharded over MPI ranks\n\nusage: shardlm COMMAND [options]  (COMMAND --help for its options)\n\n",
               SHARDLM_VERSION, SHARDLM_GIT_COMMIT);
  for (const auto& c : kCommands) std::fprintf(stderr, "  %-11s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("shardlm %s (%s)\n", SHARDLM_VERSION, SHARDLM_GIT_COMMIT);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    std::unique_ptr<shardlm::MpiEnv> mpi;
    try {
      if (c.needs_mpi) mpi = std::make_unique<shardlm::MpiEnv>(&argc, &argv);
      return c.fn(argc - 1, argv + 1);
    } catch (const shardlm::Error& e) {
      shardlm::MpiEnv::abort_job(std::string("error: ") + e.what() + " [" + e.file() + ":" + std::to_string(e.line()) + "]");
    } catch (const std::exception& e) {
      shardlm::MpiEnv::abort_job(std::string("error: ") + e.what());
    }
  }
  std::fprintf(stderr, "shardlm: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
