#include "parallel/comm_watchdog.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/mpi_env.h"

namespace shardlm {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// The process's one watching thread and the live watchdogs. Never destroyed: the thread may still
// be looking when static destructors run at exit.
class WatchdogThread {
 public:
  static WatchdogThread& get() {
    static WatchdogThread* t = new WatchdogThread;
    return *t;
  }
  void add(CommWatchdog* w) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.push_back(w);
    if (!started_) {
      started_ = true;
      std::thread([this] { loop(); }).detach();
    }
  }
  void remove(CommWatchdog* w) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(std::remove(live_.begin(), live_.end(), w), live_.end());
  }

 private:
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t now = now_ns();
      for (CommWatchdog* w : live_) {
        const int64_t since = w->since_ns_.load(std::memory_order_acquire);
        if (since == 0 || static_cast<double>(now - since) * 1e-9 <= w->limit_s_) continue;
        // Still holding the lock: the communicator cannot go away while its message is built, and
        // abort_job does not return.
        MpiEnv::abort_job("error: " + w->describe_(w->op_.load(std::memory_order_acquire)));
      }
    }
  }
  std::mutex mu_;
  std::vector<CommWatchdog*> live_;
  bool started_ = false;
};

CommWatchdog::CommWatchdog(double limit_s, std::function<std::string(const char* op)> describe)
    : limit_s_(limit_s), describe_(std::move(describe)) {
  if (limit_s_ > 0) WatchdogThread::get().add(this);
}

CommWatchdog::~CommWatchdog() {
  if (limit_s_ > 0) WatchdogThread::get().remove(this);
}

double CommWatchdog::limit_for(double timeout_s) { return timeout_s > 0 ? std::max(2 * timeout_s, timeout_s + 2) : 0; }

CommWatchdog::Busy::Busy(CommWatchdog& w, const char* op)
    : w_(w), since_(w.since_ns_.load(std::memory_order_relaxed)), op_(w.op_.load(std::memory_order_relaxed)) {
  if (since_ != 0) return;  // inside an outer mark: its start stands
  w_.op_.store(op, std::memory_order_relaxed);
  w_.since_ns_.store(now_ns(), std::memory_order_release);
}

CommWatchdog::Busy::~Busy() {
  if (since_ != 0) return;
  w_.since_ns_.store(0, std::memory_order_release);
  w_.op_.store(op_, std::memory_order_relaxed);
}

}  // namespace shardlm
