#include "parallel/replica_results.h"

#include <mpi.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "parallel/result_messages.h"

namespace shardlm {

namespace {

enum Tag : int { kResult = 101, kStep = 102, kDone = 103 };

}  // namespace

struct RemoteSink::Pending {
  std::string bytes;
  MPI_Request request = MPI_REQUEST_NULL;
};

RemoteSink::RemoteSink(int writer_rank, double timeout_s) : writer_(writer_rank), timeout_s_(timeout_s) {}

// Unsent messages at destruction mean the run failed: the job is being aborted, and waiting here
// could hang. The buffers are kept alive (leaked) since MPI may still read them.
RemoteSink::~RemoteSink() {
  for (auto& p : pending_) {
    if (p->request != MPI_REQUEST_NULL) p.release();
  }
}

void RemoteSink::post(std::string bytes, int tag) {
  SHARDLM_CHECK(bytes.size() < static_cast<size_t>(INT32_MAX), "result message of " << bytes.size() << " bytes is too large");
  auto p = std::make_unique<Pending>();
  p->bytes = std::move(bytes);
  const int rc = MPI_Isend(p->bytes.data(), static_cast<int>(p->bytes.size()), MPI_BYTE, writer_, tag, MPI_COMM_WORLD,
                           &p->request);
  SHARDLM_CHECK(rc == MPI_SUCCESS, "sending results to the writer rank " << writer_ << " failed (MPI error " << rc << ")");
  pending_.push_back(std::move(p));
  reap();
}

void RemoteSink::reap() {
  while (!pending_.empty()) {
    int done = 0;
    MPI_Test(&pending_.front()->request, &done, MPI_STATUS_IGNORE);
    if (!done) return;
    pending_.pop_front();
  }
}

void RemoteSink::on_result(const RequestResult& r) { post(pack_result(r), kResult); }
void RemoteSink::on_step(const StepRecord& s) { post(pack_step(s), kStep); }
void RemoteSink::finish(const ReplicaTotals& t) {
  post(std::string(reinterpret_cast<const char*>(&t), sizeof t), kDone);
  // The writer drains until every replica's completion message: these waits end, unless the
  // writer is stuck, which the deadline turns into an error instead of a silent hang.
  auto last = std::chrono::steady_clock::now();
  while (!pending_.empty()) {
    const size_t before = pending_.size();
    reap();
    if (pending_.size() < before) {
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count() > timeout_s_) {
      SHARDLM_FAIL("the writer rank " << writer_ << " took none of this replica's last " << pending_.size()
                                      << " result message(s) for " << timeout_s_
                                      << " s (raise --comm-timeout for very long runs)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

ReplicaCollector::ReplicaCollector(ResultSink& sink, std::vector<int> senders, double timeout_s)
    : sink_(sink), senders_(std::move(senders)), timeout_s_(timeout_s), done_(senders_.size(), false) {}

bool ReplicaCollector::receive_one() {
  int flag = 0;
  MPI_Status st;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
  if (!flag) return false;
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  std::string buf(static_cast<size_t>(n), '\0');
  MPI_Recv(buf.data(), n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  switch (st.MPI_TAG) {
    case kResult:
      sink_.on_result(unpack_result(buf));
      break;
    case kStep:
      sink_.on_step(unpack_step(buf));
      break;
    case kDone: {
      SHARDLM_CHECK(buf.size() == sizeof(ReplicaTotals), "malformed completion message from rank " << st.MPI_SOURCE);
      ReplicaTotals t;
      std::memcpy(&t, buf.data(), sizeof t);
      totals_.steps += t.steps;
      totals_.preemptions += t.preemptions;
      for (size_t i = 0; i < senders_.size(); ++i) {
        if (senders_[i] == st.MPI_SOURCE && !done_[i]) {
          done_[i] = true;
          ++finished_;
        }
      }
      break;
    }
    default:
      SHARDLM_FAIL("unexpected message tag " << st.MPI_TAG << " from rank " << st.MPI_SOURCE);
  }
  return true;
}

void ReplicaCollector::poll() {
  while (receive_one()) {
  }
}

void ReplicaCollector::drain() {
  auto last = std::chrono::steady_clock::now();
  while (finished_ < senders_.size()) {
    if (receive_one()) {
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count() > timeout_s_) {
      std::ostringstream silent;
      for (size_t i = 0; i < senders_.size(); ++i) {
        if (!done_[i]) silent << " " << senders_[i];
      }
      SHARDLM_FAIL("writer heard nothing for " << timeout_s_ << " s from unfinished replica rank(s)" << silent.str()
                                              << " (raise --comm-timeout for very long runs)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}


}  // namespace shardlm
