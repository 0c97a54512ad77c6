// Subcommands of the shardlm binary. Each returns the process exit code; errors are thrown.
#pragma once

namespace shardlm {

int cmd_run(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_make_model(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_score(int argc, char** argv);
int cmd_bench_comm(int argc, char** argv);
int cmd_bench_moe(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_report(int argc, char** argv);
int cmd_merge(int argc, char** argv);

}  // namespace shardlm
