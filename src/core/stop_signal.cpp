#include "core/stop_signal.h"

#include <csignal>

namespace shardlm {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and waits carry on; the loop looks at the flag between steps
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal() { return static_cast<int>(g_signal); }
void request_stop(int sig) { g_signal = sig; }

}  // namespace shardlm
