// See op_profile.h.
#include "compute/op_profile.h"

#include <algorithm>
#include <cstdio>

#include "compute/backend.h"
#include "core/error.h"

namespace shardlm {

void OpProfile::begin_step(const std::string& kind) {
  SHARDLM_CHECK(!in_step_, "op profile: a step begun inside another");
  in_step_ = true;
  kind_ = kind;
  marks_.clear();
  open_.clear();
  step_mark_ = b_.mark_timeline();
}

bool OpProfile::begin(const char* name, int64_t bytes) {
  if (!in_step_ || paused_ > 0) return false;
  marks_.push_back(Mark{name, bytes, b_.mark_timeline(), -1, open_.empty() ? -1 : open_.back()});
  open_.push_back(static_cast<int>(marks_.size()) - 1);
  return true;
}

void OpProfile::end() {
  SHARDLM_CHECK(in_step_ && !open_.empty(), "op profile: a section ended that was not begun in this step");
  marks_[open_.back()].end = b_.mark_timeline();
  open_.pop_back();
}

void OpProfile::end_step() {
  SHARDLM_CHECK(in_step_, "op profile: a step ended that was not begun");
  SHARDLM_CHECK(open_.empty(),
                "op profile: section '" << marks_[open_.back()].name << "' still open at the step's end");
  const int64_t last = b_.mark_timeline();
  b_.synchronize();
  in_step_ = false;
  if (std::find(kinds_.begin(), kinds_.end(), kind_) == kinds_.end()) kinds_.push_back(kind_);
  Totals& t = totals_[kind_];
  t.steps += 1;
  t.step_seconds += b_.timeline_seconds(step_mark_, last);
  // Self times: a section's time less its children's.
  // (Each mark read once: on CUDA a read is a cudaEventElapsedTime, thousands a step of a large model.)
  std::vector<double> self(marks_.size());
  for (size_t i = 0; i < marks_.size(); ++i) self[i] = b_.timeline_seconds(marks_[i].begin, marks_[i].end);
  const std::vector<double> whole = self;
  for (size_t i = 0; i < marks_.size(); ++i) {
    if (marks_[i].parent >= 0) self[marks_[i].parent] -= whole[i];
  }
  for (size_t i = 0; i < marks_.size(); ++i) {
    auto row = std::find_if(t.rows.begin(), t.rows.end(), [&](const Row& r) { return r.name == marks_[i].name; });
    if (row == t.rows.end()) row = t.rows.insert(t.rows.end(), Row{marks_[i].name, 0, 0, 0});
    row->calls += 1;
    row->seconds += self[i];
    row->bytes += marks_[i].bytes;
  }
  marks_.clear();
  b_.clear_timeline();
}

double OpProfile::Totals::section_seconds() const {
  double s = 0;
  for (const Row& r : rows) s += r.seconds;
  return s;
}

OpProfile::Totals OpProfile::totals(const std::string& kind) const {
  const auto it = totals_.find(kind);
  return it == totals_.end() ? Totals{} : it->second;
}

void OpProfile::reset() {
  SHARDLM_CHECK(!in_step_, "op profile: reset inside a step");
  kinds_.clear();
  totals_.clear();
}

std::vector<OpProfileRow> op_profile_rows(const OpProfile& p, int32_t rank) {
  std::vector<OpProfileRow> rows;
  for (const std::string& kind : p.kinds()) {
    const OpProfile::Totals t = p.totals(kind);
    for (const OpProfile::Row& r : t.rows)
      rows.push_back({rank, kind, r.name, t.steps, r.calls, r.seconds, t.step_seconds, r.bytes});
  }
  return rows;
}

OpSection::OpSection(ComputeBackend& b, const char* name, int64_t bytes) : b_(b), p_(b.op_profile()) {
  b_.push_range(name);
  if (p_ && !p_->begin(name, bytes)) p_ = nullptr;
}

OpSection::~OpSection() {
  if (p_) p_->end();
  b_.pop_range();
}

std::string format_op_profile(const OpProfile::Totals& t, const std::string& title) {
  if (t.steps == 0) return "";
  const double n = static_cast<double>(t.steps), step = t.step_seconds / n;
  std::vector<OpProfile::Row> rows = t.rows;
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%s: %lld step%s, %.1f us a step\n", title.c_str(), static_cast<long long>(t.steps),
                t.steps == 1 ? "" : "s", step * 1e6);
  out += line;
  std::snprintf(line, sizeof line, "  %-24s %10s %12s %12s %7s\n", "section", "calls/step", "us/step", "weights GB/s",
                "share");
  out += line;
  auto add = [&](const std::string& name, const std::string& calls, double s, int64_t bytes) {
    char rate[32] = "";
    if (bytes > 0 && s > 0) std::snprintf(rate, sizeof rate, "%.1f", static_cast<double>(bytes) / s / 1e9);
    std::snprintf(line, sizeof line, "  %-24s %10s %12.1f %12s %6.1f%%\n", name.c_str(), calls.c_str(), s / n * 1e6,
                  rate, step > 0 ? 100.0 * s / t.step_seconds : 0.0);
    out += line;
  };
  for (const OpProfile::Row& r : rows) {
    char calls[32];
    std::snprintf(calls, sizeof calls, "%.4g", static_cast<double>(r.calls) / n);
    add(r.name, calls, r.seconds, r.bytes);
  }
  add("(outside sections)", "", t.step_seconds - t.section_seconds(), 0);
  return out;
}

}  // namespace shardlm
