// Where a step's time goes, op group by op group (shardlm bench --op-profile, run --op-profile).
//
// The model code names sections of its work with OpSection ("attn core", "mlp down", "tp
// all-reduce"); the profile stamps each section's start and end on the backend's timeline
// (ComputeBackend::mark_timeline: on CUDA, events on the stream, so a section's time is the
// device's, including its idle waits for the host's launches). At the end of each step it reads the
// marks and adds every section's self time (its time less that of the sections inside it) to the
// totals of the step's kind. What no section covers (the step's inputs uploaded, the host's own
// work between the ops) is the step's time less the sections'. Only steps the profile brackets
// count (begin_step / end_step, called by the decoder where a step's logits end on its rank);
// sections outside them, and all of a captured step (Pause), are not timed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardlm {

class ComputeBackend;

class OpProfile {
 public:
  explicit OpProfile(ComputeBackend& backend) : b_(backend) {}

  // A step's first op is next; kind names the totals it adds to ("decode", "prefill").
  void begin_step(const std::string& kind);
  // The step's last op has been issued: synchronizes the backend and adds the step's figures.
  void end_step();
  bool in_step() const { return in_step_; }

  // A section's start and end (OpSection pairs them); bytes: what the section's ops read of the
  // weights (0: not counted). begin returns whether it was marked (not outside a step, nor while
  // paused); only a marked section is ended.
  bool begin(const char* name, int64_t bytes = 0);
  void end();

  // Captured work (a CUDA graph being recorded) puts no marks on the timeline.
  class Pause {
   public:
    explicit Pause(OpProfile* p) : p_(p) {
      if (p_) ++p_->paused_;
    }
    ~Pause() {
      if (p_) --p_->paused_;
    }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    OpProfile* p_;
  };

  struct Row {
    std::string name;
    int64_t calls = 0;   // over all steps
    double seconds = 0;  // self time over all steps
    int64_t bytes = 0;   // weight bytes read over all steps (0: not counted)
  };
  struct Totals {
    int64_t steps = 0;
    double step_seconds = 0;  // the steps' whole time on the timeline
    std::vector<Row> rows;    // in the order first seen
    double section_seconds() const;
  };
  // The totals of a kind (empty when no step of it ran) and the kinds seen, in order.
  Totals totals(const std::string& kind) const;
  const std::vector<std::string>& kinds() const { return kinds_; }
  void reset();

 private:
  struct Mark {
    const char* name;
    int64_t bytes;
    int64_t begin, end = -1;
    int parent;  // index into marks_, -1 at the top
  };
  ComputeBackend& b_;
  bool in_step_ = false;
  int paused_ = 0;
  std::string kind_;
  int64_t step_mark_ = -1;
  std::vector<Mark> marks_;
  std::vector<int> open_;  // indices of the sections begun and not ended
  std::vector<std::string> kinds_;
  std::map<std::string, Totals> totals_;
};

// One section of the op profile around the enclosing scope, and a named range for external
// profilers (ComputeBackend::push_range). Costs two virtual calls without a profile. bytes: the
// weight bytes its ops read (weight_bytes), for the table's GB/s; 0 where they are not counted.
class OpSection {
 public:
  OpSection(ComputeBackend& b, const char* name, int64_t bytes = 0);
  ~OpSection();
  OpSection(const OpSection&) = delete;
  OpSection& operator=(const OpSection&) = delete;

 private:
  ComputeBackend& b_;
  OpProfile* p_;  // null: the section was not marked
};

// One rank's totals as rows, a row per (kind, section), for /op_profile of the result file: the
// kind's steps and their whole time repeated on each of its rows.
struct OpProfileRow {
  int32_t rank = 0;
  std::string kind, section;
  int64_t steps = 0, calls = 0;
  double seconds = 0, step_seconds = 0;
  int64_t bytes = 0;
};
std::vector<OpProfileRow> op_profile_rows(const OpProfile& p, int32_t rank);

// The totals of a kind as a table: each section's calls and microseconds per step, the rate it read
// its weights at (where counted) and its share of the step, largest first, then the time outside
// every section. Empty when no step of the kind ran.
std::string format_op_profile(const OpProfile::Totals& t, const std::string& title);

}  // namespace shardlm
