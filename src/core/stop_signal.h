// Graceful stop on SIGTERM / SIGINT (Slurm preemption, scancel, Ctrl-C): the handler only records
// the signal; the generation loop checks it between steps, stops admitting work, and the run
// flushes and closes its output before exiting non-zero.
#pragma once

namespace shardlm {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the signal received, 0 if none
// For tests: as if the signal had arrived.
void request_stop(int sig);

}  // namespace shardlm
