// Replicas (independent model copies) send their finished requests and step records to the writer
// rank, which owns the one HDF5 file. Senders never wait for the writer: messages go out
// nonblocking (a blocking send of a large result would hold its sender until the writer polls,
// and with dp groups in lockstep the writer may be waiting on that very sender); the writer polls
// between its own steps and drains at the end.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace shardlm {

struct ReplicaTotals {
  int64_t steps = 0;
  int64_t preemptions = 0;
};

// On a replica that is not the writer: forwards everything to the writer rank.
class RemoteSink final : public ResultSink {
 public:
  // timeout_s: how long finish() waits for the writer to take the last messages.
  RemoteSink(int writer_rank, double timeout_s);
  ~RemoteSink() override;
  void on_result(const RequestResult& r) override;
  void on_step(const StepRecord& s) override;
  // Tells the writer this replica is done (its totals ride along) and waits until every message
  // has been delivered; throws naming the writer when it takes none for timeout_s.
  void finish(const ReplicaTotals& totals);

 private:
  struct Pending;  // a message in flight and its buffer
  void post(std::string bytes, int tag);
  void reap();  // forgets the messages already delivered

  int writer_;
  double timeout_s_;
  std::deque<std::unique_ptr<Pending>> pending_;
};

// On the writer rank: receives from the other replicas' leaders into `sink`.
class ReplicaCollector {
 public:
  // `senders`: world ranks of the other replica leaders. `timeout_s`: how long drain() waits
  // without hearing from a replica that has not finished.
  ReplicaCollector(ResultSink& sink, std::vector<int> senders, double timeout_s);
  // Takes whatever has arrived, without blocking.
  void poll();
  // Blocks until every other rank has finished; throws Error naming the silent ranks on timeout.
  void drain();
  const ReplicaTotals& totals() const { return totals_; }

 private:
  bool receive_one();

  ResultSink& sink_;
  std::vector<int> senders_;
  double timeout_s_;
  size_t finished_ = 0;
  std::vector<bool> done_;  // per sender
  ReplicaTotals totals_;
};


}  // namespace shardlm
