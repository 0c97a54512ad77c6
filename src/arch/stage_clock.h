// Times this rank's part of a step for the /steps rows (arch/model.h StageSeconds): the wall time
// while it runs and, of that, the time inside its communicators' calls (their CommStats seconds);
// compute is the rest. Parts of one step add up until take().
#pragma once

#include <algorithm>
#include <chrono>
#include <exception>
#include <vector>

#include "arch/model.h"
#include "arch/shard_plan.h"
#include "parallel/communicator.h"

namespace shardlm {

class StageClock {
 public:
  explicit StageClock(const ShardComms& comms) {
    for (Communicator* c : {comms.tp, comms.pp, comms.ep}) {
      if (c && std::find(comms_.begin(), comms_.end(), c) == comms_.end()) comms_.push_back(c);
    }
  }
  // A part begins (the time of one begun and never stopped, a part that threw, is dropped).
  void start() {
    t0_ = Clock::now();
    c0_ = comm_seconds();
    running_ = true;
  }
  void stop() {
    if (!running_) return;
    wall_ += std::chrono::duration<double>(Clock::now() - t0_).count();
    comm_ += comm_seconds() - c0_;
    running_ = false;
  }
  // The parts timed since the last take(), and a fresh start.
  StageSeconds take() {
    stop();
    const StageSeconds s{std::max(0.0, wall_ - comm_), comm_};
    wall_ = comm_ = 0;
    return s;
  }
  // Times a scope as one part.
  class Part {
   public:
    explicit Part(StageClock& c) : c_(c), exceptions_(std::uncaught_exceptions()) { c_.start(); }
    ~Part() {
      if (std::uncaught_exceptions() == exceptions_) c_.stop();  // else the part threw: dropped
    }
    Part(const Part&) = delete;
    Part& operator=(const Part&) = delete;

   private:
    StageClock& c_;
    int exceptions_;
  };

 private:
  using Clock = std::chrono::steady_clock;
  double comm_seconds() const {
    double s = 0;
    for (const Communicator* c : comms_) s += c->stats().seconds;
    return s;
  }
  std::vector<Communicator*> comms_;
  Clock::time_point t0_{};
  double c0_ = 0, wall_ = 0, comm_ = 0;
  bool running_ = false;
};

}  // namespace shardlm
