// Graph steps over an expert-parallel group (arch/step_graphs.h): every rank of the group must
// replay, capture and drop its graphs at the same steps, or a rank warming up a bucket runs its
// exchanges while a peer replays, and the collectives pair up wrongly (a hang on NCCL, or rows
// from the wrong step). Two ranks run here in threads, each with its own recording backend
// (tests/common/recording_backend.h) and scratch, joined by an in-process communicator that
// checks that both ranks call the same collective at every meeting. The dp groups' batches
// differ, as they do in a run: one rank's earlier steps were larger than the other's, or one
// rank has no tokens at all, so their scratch grows at different steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "arch/model.h"
#include "arch/scratch.h"
#include "arch/shard_plan.h"
#include "arch/step_graphs.h"
#include "common/recording_backend.h"
#include "core/error.h"
#include "engine/kv_cache.h"
#include "model/model_spec.h"
#include "parallel/communicator.h"

namespace shardlm {
namespace {

constexpr int kRanks = 2;

// Where the ranks meet for each collective: each brings the collective's description and its
// values, and gets the element-wise maximum of everyone's. A rank that brings another
// description than its peers, or waits for a peer that has finished, ends every rank's run with
// an Error naming both calls.
class Meeting {
 public:
  std::vector<int64_t> meet(int rank, const std::string& what, const std::vector<int64_t>& v) {
    std::unique_lock<std::mutex> lk(m_);
    if (!error_.empty()) throw std::runtime_error(error_);
    const int64_t round = round_;
    what_[rank] = what;
    values_[rank] = v;
    if (++arrived_ == kRanks) {
      result_ = values_[0];
      for (int r = 1; r < kRanks; ++r) {
        if (what_[r] != what_[0] || values_[r].size() != result_.size()) {
          error_ = "meeting " + std::to_string(round) + ": rank 0 called " + what_[0] + ", rank " + std::to_string(r) +
                   " " + what_[r];
          break;
        }
        for (size_t i = 0; i < result_.size(); ++i) result_[i] = std::max(result_[i], values_[r][i]);
      }
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lk, std::chrono::seconds(60),
                             [&] { return round_ != round || !error_.empty() || finished_ > 0; })) {
      error_ = "rank " + std::to_string(rank) + " waited 60 s in " + what;
    } else if (round_ == round && error_.empty()) {
      error_ = "rank " + std::to_string(rank) + " called " + what + " after a peer had finished";
    }
    if (!error_.empty()) {
      cv_.notify_all();
      throw std::runtime_error(error_);
    }
    return result_;
  }
  // A rank is done: peers still waiting for it fail instead of waiting out the timeout.
  void finish() {
    std::lock_guard<std::mutex> lk(m_);
    ++finished_;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int64_t round_ = 0;
  int arrived_ = 0, finished_ = 0;
  std::string what_[kRanks];
  std::vector<int64_t> values_[kRanks];
  std::vector<int64_t> result_;
  std::string error_;
};

// The ep group of one rank: max all-reduces of int32 or int64, on the host or queued (run now, or
// recorded into the graph being captured and run at each replay, as NCCL queues on a stream).
// Every collective this rank takes part in is logged in order.
class MeetingComm final : public Communicator {
 public:
  MeetingComm(Meeting& meeting, int rank, test::RecordingBackend& rec) : meeting_(meeting), rank_(rank), rec_(rec) {}

  int rank() const override { return rank_; }
  int size() const override { return kRanks; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int r) const override { return r; }
  bool can_enqueue() const override { return true; }

  void all_reduce(void* buf, size_t count, CommDType t, ReduceOp op) override {
    reduce("all_reduce", buf, count, t, op);
  }
  void enqueue_all_reduce(void* buf, size_t count, CommDType t, ReduceOp op, void*) override {
    ++stats_.calls;
    rec_.record_or_run([=, this] { reduce("queued all_reduce", buf, count, t, op); });
  }

  void all_gather(const void*, void*, size_t, CommDType) override { unused("all_gather"); }
  void reduce_scatter(const void*, void*, size_t, CommDType, ReduceOp) override { unused("reduce_scatter"); }
  void all_to_all(const void*, void*, size_t, CommDType) override { unused("all_to_all"); }
  void all_to_allv(const void*, const std::vector<size_t>&, const std::vector<size_t>&, void*,
                   const std::vector<size_t>&, const std::vector<size_t>&, CommDType) override {
    unused("all_to_allv");
  }
  void broadcast(void*, size_t, CommDType, int) override { unused("broadcast"); }
  std::unique_ptr<CommRequest> isend(const void*, size_t, CommDType, int, int) override { unused("isend"); }
  std::unique_ptr<CommRequest> irecv(void*, size_t, CommDType, int, int) override { unused("irecv"); }
  void send_recv(const void*, size_t, int, void*, size_t, int, CommDType, int) override { unused("send_recv"); }
  void barrier() override { unused("barrier"); }

  const std::vector<std::string>& log() const { return log_; }

 private:
  void reduce(const char* kind, void* buf, size_t count, CommDType t, ReduceOp op) {
    SHARDLM_CHECK(op == ReduceOp::kMax && (t == CommDType::kI32 || t == CommDType::kI64),
                  "the test's communicator reduces int32 or int64 by max only");
    std::ostringstream what;
    what << kind << (t == CommDType::kI32 ? " i32" : " i64") << " x" << count;
    std::vector<int64_t> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = t == CommDType::kI32 ? static_cast<int32_t*>(buf)[i] : static_cast<int64_t*>(buf)[i];
    log_.push_back(what.str());
    v = meeting_.meet(rank_, what.str(), v);
    for (size_t i = 0; i < count; ++i) {
      if (t == CommDType::kI32)
        static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v[i]);
      else
        static_cast<int64_t*>(buf)[i] = v[i];
    }
  }
  [[noreturn]] void unused(const char* op) {
    throw std::runtime_error(std::string("the test's communicator has no ") + op);
  }

  Meeting& meeting_;
  int rank_;
  test::RecordingBackend& rec_;
  std::vector<std::string> log_;
  const std::string name_ = "ep(test)";
};

constexpr int64_t kBlockSize = 4, kBlocks = 32;
constexpr int kWorkSlot = Scratch::kAttention;  // stands for every slot a layer sizes by its rows
constexpr int64_t kWorkWidth = 64;

// A step of one rank: `prefill` tokens of two sequences (never a graph step), else `decode`
// sequences of one token each (0: the rank has no tokens).
struct StepRows {
  int64_t prefill = 0, decode = 0;
};

ForwardBatch make_batch(const StepRows& s) {
  ForwardBatch b;
  if (s.prefill > 0) {
    const int64_t half = s.prefill / 2;
    for (int64_t t = 0; t < s.prefill; ++t) {
      const int32_t seq = t < half ? 0 : 1;
      const int64_t pos = seq == 0 ? t : t - half;
      b.tokens.push_back(static_cast<int32_t>(3 + t));
      b.positions.push_back(static_cast<int32_t>(pos));
      b.slots.push_back(seq * 8 * kBlockSize + pos);
      b.token_seq.push_back(seq);
    }
    b.seq_block_start = {0, 8, 16};
    for (int32_t k = 0; k < 16; ++k) b.blocks.push_back(k);
    b.logit_rows = {static_cast<int32_t>(half - 1), static_cast<int32_t>(s.prefill - 1)};
    return b;
  }
  for (int64_t t = 0; t < s.decode; ++t) {
    b.tokens.push_back(static_cast<int32_t>(5 + t));
    b.positions.push_back(static_cast<int32_t>(6));
    b.slots.push_back(t * kBlockSize * 2 + 6);
    b.token_seq.push_back(static_cast<int32_t>(t));
    b.logit_rows.push_back(static_cast<int32_t>(t));
    b.seq_block_start.push_back(static_cast<int32_t>(2 * t));
    b.blocks.push_back(static_cast<int32_t>(2 * t));
    b.blocks.push_back(static_cast<int32_t>(2 * t + 1));
  }
  b.seq_block_start.push_back(static_cast<int32_t>(2 * s.decode));
  return b;
}

// One rank of the group with the decoder's part of a step reduced to what matters here: the
// slots it sizes by its rows and one exchange per step (eager: on the host; in a graph: queued).
struct Rank {
  Rank(Meeting& meeting, int r)
      : comm(meeting, r, rec), scratch(rec), cache(rec, shape(), kBlocks * shape().bytes_per_block(), kBlocks) {
    spec.max_position_embeddings = 64;
    plan.vocab = 100;
    graphs = std::make_unique<StepGraphs>(rec, scratch, spec, plan, ShardComms{nullptr, nullptr, nullptr, &comm});
    exchange = static_cast<int32_t*>(rec.alloc(sizeof(int32_t)));
  }
  ~Rank() { rec.free(exchange); }
  static KvCacheShape shape() {
    KvCacheShape s;
    s.num_layers = 1;
    s.k_width = s.v_width = 4;
    s.block_size = kBlockSize;
    return s;
  }

  void eager(const ForwardBatch& batch) {
    const size_t rows = static_cast<size_t>(std::max<int64_t>(batch.num_tokens(), 1));
    scratch.get_as<int32_t>(3, rows);
    scratch.get_as<int32_t>(4, rows);
    scratch.get_as<int64_t>(5, rows);
    scratch.get_as<int32_t>(6, std::max<size_t>(batch.blocks.size(), 1));
    scratch.get_as<int32_t>(7, rows);
    scratch.get(kWorkSlot, rows * kWorkWidth);
    int64_t v = batch.num_tokens();
    comm.all_reduce(&v, 1, CommDType::kI64, ReduceOp::kMax);
  }
  void work(int64_t B) {
    scratch.get(kWorkSlot, static_cast<size_t>(B * kWorkWidth));
    comm.enqueue_all_reduce(exchange, 1, CommDType::kI32, ReduceOp::kMax, rec.current_stream());
  }
  // Runs the steps the way the decoder does (step_to_device, graph_step).
  void run(const std::vector<StepRows>& steps) {
    for (const StepRows& s : steps) {
      const ForwardBatch batch = make_batch(s);
      const int64_t B = graphs->step_bucket(batch, cache, nullptr);
      if (B == 0) {
        eager(batch);
        continue;
      }
      ++graph_steps;
      const StepContext ctx = graphs->upload_inputs(batch, B, cache, nullptr);
      const StepGraphs::Captured& step = graphs->ready(
          ctx, [&] { work(ctx.T); }, [] {}, nullptr);
      SHARDLM_CHECK(graphs->replay(step, ctx), "no exchange can overflow here");
    }
  }

  test::RecordingBackend rec;
  MeetingComm comm;
  Scratch scratch;
  KvCache cache;
  ModelSpec spec;
  ShardPlan plan;
  std::unique_ptr<StepGraphs> graphs;
  int32_t* exchange = nullptr;
  int64_t graph_steps = 0;
};

// Runs each rank's steps in its own thread and checks that the ranks met alike and replayed.
void run_group(const std::vector<StepRows> (&steps)[kRanks], const std::string& name) {
  Meeting meeting;
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back(std::make_unique<Rank>(meeting, r));
  for (auto& r : ranks) ASSERT_EQ(r->graphs->enable(2.0, false), "");
  std::string errors[kRanks];
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        ranks[r]->run(steps[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      meeting.finish();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << name << ": rank " << r;
  EXPECT_EQ(ranks[0]->comm.log(), ranks[1]->comm.log()) << name;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GT(ranks[r]->graph_steps, 0) << name;
    EXPECT_EQ(ranks[r]->graphs->steps(), ranks[r]->graph_steps) << name << ": rank " << r << " replayed";
  }
  // The group captured and dropped together.
  EXPECT_EQ(ranks[0]->rec.captures(), ranks[1]->rec.captures()) << name;
  EXPECT_EQ(ranks[0]->rec.drops(), ranks[1]->rec.drops()) << name;
  EXPECT_EQ(ranks[0]->rec.live_graphs(), ranks[1]->rec.live_graphs()) << name;
}

// Rank 1's dp group has no tokens: its slots were sized for one row, so a bucket larger than
// any before grows them (its inputs and its layers' slots) where rank 0's, sized by its prefill,
// do not. Rank 0 goes from bucket 1 to 2 and back: both ranks must still hold bucket 1's graph
// or capture it again together.
TEST(StepGraphsEp, AnIdleRankGrowsItsScratchWithItsPeers) {
  const std::vector<StepRows> busy = {{12, 0}, {0, 1}, {0, 1}, {0, 2}, {0, 1}, {0, 2}, {0, 4}, {0, 1}, {0, 3}};
  const std::vector<StepRows> idle(busy.size());
  run_group({busy, idle}, "idle rank 1");
  run_group({idle, busy}, "idle rank 0");
}

// Both ranks busy, their eager steps of different sizes: rank 1's larger prefill between graph
// steps reallocates its slots, and the whole group recaptures (step_bucket's agreement).
TEST(StepGraphsEp, EagerGrowthOnOneRankRecapturesOnAll) {
  const std::vector<StepRows> r0 = {{8, 0}, {0, 2}, {0, 1}, {0, 2}, {0, 2}, {0, 1}, {0, 2}};
  const std::vector<StepRows> r1 = {{4, 0}, {0, 1}, {0, 1}, {40, 0}, {0, 2}, {0, 1}, {0, 1}};
  run_group({r0, r1}, "rank 1 prefills mid-way");
}

}  // namespace
}  // namespace shardlm
