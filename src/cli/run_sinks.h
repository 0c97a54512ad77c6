// Where `shardlm run` takes requests from and hands results to.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"
#include "io/duplicate_id.h"
#include "io/request_reader.h"
#include "io/result_writer.h"
#include "parallel/line_queue.h"
#include "parallel/replica_results.h"

namespace shardlm {

class ReaderSource final : public RequestSource {
 public:
  explicit ReaderSource(RequestReader& r) : r_(r) {}
  std::optional<ParsedRequest> next() override { return r_.next(); }

 private:
  RequestReader& r_;
};

// A replica's requests when several share the file: windows of lines claimed one after another
// from the shared queue, so a faster replica takes more.
class ClaimingSource final : public RequestSource {
 public:
  ClaimingSource(RequestReader& r, LineQueue& q) : r_(r), q_(q) { r_.set_window(1, 1); }
  std::optional<ParsedRequest> next() override {
    for (;;) {
      if (auto req = r_.next()) return req;
      if (r_.eof()) return std::nullopt;
      const auto [first, end] = q_.claim();
      r_.set_window(first, end);
    }
  }

 private:
  RequestReader& r_;
  LineQueue& q_;
};

// Drops requests whose ids a resumed output already holds.
class SkipFinishedSource final : public RequestSource {
 public:
  // done: the request_key of every row the file holds.
  SkipFinishedSource(RequestSource& inner, const std::unordered_set<std::string>& done) : inner_(inner), done_(done) {}
  std::optional<ParsedRequest> next() override {
    for (;;) {
      std::optional<ParsedRequest> r = inner_.next();
      if (!r || !done_.count(request_key(r->id, r->line))) return r;
      ++skipped_;
    }
  }
  int64_t skipped() const { return skipped_; }

 private:
  RequestSource& inner_;
  const std::unordered_set<std::string>& done_;
  int64_t skipped_ = 0;
};

// On the writer rank: every result (its own and other replicas') goes to the file and the totals.
// An id seen before (a duplicate in the prompt file, or one a resumed file holds) is written as an
// error row without output, so the file holds each id's output once. Each row, once written, and
// each step go on to `then` (the metrics), which so sees what the file holds.
class WriterSink final : public ResultSink {
 public:
  // keys_in_file: the request_key of every row the file holds.
  WriterSink(ResultWriter& w, RunStats& stats, const std::vector<std::string>& keys_in_file, ResultSink& then)
      : w_(w), stats_(stats), then_(then) {
    for (const std::string& key : keys_in_file) seen_.insert(hash_id(key));
  }
  void on_result(const RequestResult& r) override {
    if (!seen_.insert(hash_id(request_key(r.id, r.line))).second) {
      RequestResult dup;
      dup.id = r.id;
      dup.line = r.line;
      dup.replica = r.replica;
      dup.prompt_tokens = r.prompt_tokens;
      dup.finish_reason = FinishReason::kError;
      dup.error = duplicate_id_error(r.line, r.id);
      dup.t_queued = r.t_queued;
      dup.t_first_token = dup.t_finished = r.t_finished;
      w_.append(dup);
      stats_.add_result(dup);
      then_.on_result(dup);
      return;
    }
    w_.append(r);
    stats_.add_result(r);
    then_.on_result(r);
  }
  void on_step(const StepRecord& s) override {
    w_.append_step(s);
    then_.on_step(s);
  }

 private:
  // 64-bit hashes, not the ids: 8 bytes a request however long the ids are.
  static uint64_t hash_id(const std::string& id) { return std::hash<std::string>{}(id); }

  ResultWriter& w_;
  RunStats& stats_;
  ResultSink& then_;
  std::unordered_set<uint64_t> seen_;
};

// The writer rank's own engine: after each of its steps, take in what other replicas sent.
class PollingSink final : public ResultSink {
 public:
  PollingSink(ResultSink& inner, ReplicaCollector& c) : inner_(inner), c_(c) {}
  void on_result(const RequestResult& r) override { inner_.on_result(r); }
  void on_step(const StepRecord& s) override {
    inner_.on_step(s);
    c_.poll();
  }

 private:
  ResultSink& inner_;
  ReplicaCollector& c_;
};

}  // namespace shardlm
