// ResultWriter: buffers finished requests and scheduler steps and appends them to the HDF5 file
// column by column, a batch at a time.
#include "io/result_writer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "compute/op_profile.h"
#include "core/error.h"
#include "io/h5_column.h"
#include "io/h5_util.h"
#include "core/utf8.h"

namespace shardlm {
namespace {

constexpr hsize_t kChunkRows = 256;
constexpr size_t kStepBatch = 1024;  // steps are written once this many are buffered, and at flush

using h5::Column;
using h5::ColumnKind;

template <typename T>
hvl_t vlen_of(const std::vector<T>& v) {
  hvl_t h;
  h.len = v.size();
  h.p = v.empty() ? nullptr : const_cast<T*>(v.data());
  return h;
}

// The /requests columns, in schema order.
struct RequestColumns {
  Column id, line, prompt_tokens, output_tokens, output_text, finish_reason, token_logprobs, top_token_ids,
      top_logprobs, prompt_logprobs, prompt_top_token_ids, prompt_top_logprobs, error, t_queued, t_first_token,
      t_finished, replica;
  // With a chunk size (m = kChunkRows) the columns are created; without, an existing file's are opened.
  template <typename... Mode>
  RequestColumns(hid_t g, const std::string& ctx, Mode... m)
      : id(g, "id", ColumnKind::kString, m..., ctx),
        line(g, "line", ColumnKind::kInt64, m..., ctx),
        prompt_tokens(g, "prompt_tokens", ColumnKind::kVlenInt32, m..., ctx),
        output_tokens(g, "output_tokens", ColumnKind::kVlenInt32, m..., ctx),
        output_text(g, "output_text", ColumnKind::kString, m..., ctx),
        finish_reason(g, "finish_reason", ColumnKind::kString, m..., ctx),
        token_logprobs(g, "token_logprobs", ColumnKind::kVlenFloat32, m..., ctx),
        top_token_ids(g, "top_token_ids", ColumnKind::kVlenInt32, m..., ctx),
        top_logprobs(g, "top_logprobs", ColumnKind::kVlenFloat32, m..., ctx),
        prompt_logprobs(g, "prompt_logprobs", ColumnKind::kVlenFloat32, m..., ctx),
        prompt_top_token_ids(g, "prompt_top_token_ids", ColumnKind::kVlenInt32, m..., ctx),
        prompt_top_logprobs(g, "prompt_top_logprobs", ColumnKind::kVlenFloat32, m..., ctx),
        error(g, "error", ColumnKind::kString, m..., ctx),
        t_queued(g, "t_queued", ColumnKind::kFloat64, m..., ctx),
        t_first_token(g, "t_first_token", ColumnKind::kFloat64, m..., ctx),
        t_finished(g, "t_finished", ColumnKind::kFloat64, m..., ctx),
        replica(g, "replica", ColumnKind::kInt32, m..., ctx) {}
  std::vector<Column*> all() {
    return {&id,
            &line,
            &prompt_tokens,
            &output_tokens,
            &output_text,
            &finish_reason,
            &token_logprobs,
            &top_token_ids,
            &top_logprobs,
            &prompt_logprobs,
            &prompt_top_token_ids,
            &prompt_top_logprobs,
            &error,
            &t_queued,
            &t_first_token,
            &t_finished,
            &replica};
  }
};

// The /steps columns.
struct StepColumns {
  Column step, replica, batch_size, prefill_tokens, decode_tokens, kv_blocks_used, running, waiting, t_start, wall_s,
      moe_dispatch_s, moe_combine_s, moe_dispatch_bytes, moe_combine_bytes, expert_tokens, stage_compute_s,
      stage_comm_s;
  template <typename... Mode>
  StepColumns(hid_t g, const std::string& ctx, Mode... m)
      : step(g, "step", ColumnKind::kInt64, m..., ctx),
        replica(g, "replica", ColumnKind::kInt32, m..., ctx),
        batch_size(g, "batch_size", ColumnKind::kInt32, m..., ctx),
        prefill_tokens(g, "prefill_tokens", ColumnKind::kInt32, m..., ctx),
        decode_tokens(g, "decode_tokens", ColumnKind::kInt32, m..., ctx),
        kv_blocks_used(g, "kv_blocks_used", ColumnKind::kInt32, m..., ctx),
        running(g, "running", ColumnKind::kInt32, m..., ctx),
        waiting(g, "waiting", ColumnKind::kInt32, m..., ctx),
        t_start(g, "t_start", ColumnKind::kFloat64, m..., ctx),
        wall_s(g, "wall_s", ColumnKind::kFloat64, m..., ctx),
        moe_dispatch_s(g, "moe_dispatch_s", ColumnKind::kFloat64, m..., ctx),
        moe_combine_s(g, "moe_combine_s", ColumnKind::kFloat64, m..., ctx),
        moe_dispatch_bytes(g, "moe_dispatch_bytes", ColumnKind::kInt64, m..., ctx),
        moe_combine_bytes(g, "moe_combine_bytes", ColumnKind::kInt64, m..., ctx),
        expert_tokens(g, "expert_tokens", ColumnKind::kVlenInt32, m..., ctx),
        stage_compute_s(g, "stage_compute_s", ColumnKind::kVlenFloat64, m..., ctx),
        stage_comm_s(g, "stage_comm_s", ColumnKind::kVlenFloat64, m..., ctx) {}
  std::vector<Column*> all() {
    return {&step,
            &replica,
            &batch_size,
            &prefill_tokens,
            &decode_tokens,
            &kv_blocks_used,
            &running,
            &waiting,
            &t_start,
            &wall_s,
            &moe_dispatch_s,
            &moe_combine_s,
            &moe_dispatch_bytes,
            &moe_combine_bytes,
            &expert_tokens,
            &stage_compute_s,
            &stage_comm_s};
  }
};

// Holds the C strings handed to HDF5 for one batch; text that is not UTF-8 is repaired into
// `fixed` (a deque, so earlier pointers stay valid). HDF5's strings end at a NUL, so a NUL byte (a
// byte-fallback <0x00> token's text) is written as U+FFFD instead of cutting the rest off; the
// row's token ids keep the exact output.
struct StringBatch {
  std::deque<std::string> fixed;
  const char* add(const std::string& s) {
    const bool nul = s.find('\0') != std::string::npos;
    if (!nul && is_valid_utf8(s)) return s.c_str();
    std::string t = repair_utf8(s);
    for (size_t at = t.find('\0'); at != std::string::npos; at = t.find('\0', at + 3)) t.replace(at, 1, "\xEF\xBF\xBD");
    fixed.push_back(std::move(t));
    return fixed.back().c_str();
  }
};

// A file written before a group had some of its list columns, resumed: they are added, an empty
// list for each row already there (no stage timed, no logprobs asked), so every column has the
// same rows. `first` is a column every version wrote.
void add_list_columns(hid_t group, const char* first, ColumnKind first_kind,
                      std::initializer_list<std::pair<const char*, ColumnKind>> columns, const std::string& ctx) {
  for (const auto& [name, kind] : columns) {
    if (H5Lexists(group, name, H5P_DEFAULT) > 0) continue;
    const Column existing(group, first, first_kind, ctx);
    Column added(group, name, kind, kChunkRows, ctx);
    const std::vector<hvl_t> empty(static_cast<size_t>(existing.size()), hvl_t{0, nullptr});
    if (!empty.empty()) added.append(empty.data(), empty.size());
  }
}

}  // namespace

struct ResultWriter::Impl {
  std::string path;
  std::string ctx;  // "HDF5 output '<path>'", the prefix of every error
  size_t flush_every;
  double flush_seconds = 0;
  std::chrono::steady_clock::time_point last_flush;
  hid_t file = H5I_INVALID_HID;
  h5::Id requests_group, steps_group;
  std::optional<RequestColumns> req;
  std::optional<StepColumns> steps;
  std::vector<RequestResult> pending;
  std::vector<StepRecord> pending_steps;
  int64_t rows_written = 0;
  bool open = false;

  // Time-based flushes bound what a crash loses when requests finish slowly.
  bool flush_due() const {
    return flush_seconds > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush).count() >= flush_seconds;
  }
  void write_requests();
  void write_steps();
  void release_handles();
  // Writes what is buffered and makes it durable: the data first, then the row counts that say it
  // is whole. A kill inside HDF5 between flushes can leave a dataset's new extent on disk before
  // its rows (they read back as garbage); a resumed run keeps only the committed rows.
  void commit();
};

void ResultWriter::Impl::commit() {
  write_requests();
  write_steps();
  h5::check(H5Fflush(file, H5F_SCOPE_GLOBAL), "H5Fflush", ctx);
  h5::write_attr(file, "rows_committed", rows_written, ctx);
  h5::write_attr(file, "steps_committed", static_cast<int64_t>(steps->all().front()->size()), ctx);
  h5::check(H5Fflush(file, H5F_SCOPE_GLOBAL), "H5Fflush", ctx);
}

void ResultWriter::Impl::write_requests() {
  const size_t n = pending.size();
  if (n == 0) return;
  StringBatch strings;
  std::vector<const char*> ids(n), texts(n), reasons(n), errors(n);
  std::vector<int64_t> lines(n);
  std::vector<hvl_t> prompt_tokens(n), output_tokens(n), logprobs(n), top_ids(n), top_lps(n), prompt_lps(n),
      prompt_top_ids(n), prompt_top_lps(n);
  std::vector<double> t_queued(n), t_first(n), t_finished(n);
  std::vector<int32_t> replicas(n);
  for (size_t i = 0; i < n; ++i) {
    const RequestResult& r = pending[i];
    ids[i] = strings.add(r.id);
    texts[i] = strings.add(r.output_text);
    reasons[i] = finish_reason_name(r.finish_reason);
    errors[i] = strings.add(r.error);
    lines[i] = r.line;
    prompt_tokens[i] = vlen_of(r.prompt_tokens);
    output_tokens[i] = vlen_of(r.output_tokens);
    logprobs[i] = vlen_of(r.token_logprobs);
    top_ids[i] = vlen_of(r.top_token_ids);
    top_lps[i] = vlen_of(r.top_logprobs);
    prompt_lps[i] = vlen_of(r.prompt_logprobs);
    prompt_top_ids[i] = vlen_of(r.prompt_top_token_ids);
    prompt_top_lps[i] = vlen_of(r.prompt_top_logprobs);
    t_queued[i] = r.t_queued;
    t_first[i] = r.t_first_token;
    t_finished[i] = r.t_finished;
    replicas[i] = r.replica;
  }
  req->id.append(ids.data(), n);
  req->line.append(lines.data(), n);
  req->prompt_tokens.append(prompt_tokens.data(), n);
  req->output_tokens.append(output_tokens.data(), n);
  req->output_text.append(texts.data(), n);
  req->finish_reason.append(reasons.data(), n);
  req->token_logprobs.append(logprobs.data(), n);
  req->top_token_ids.append(top_ids.data(), n);
  req->top_logprobs.append(top_lps.data(), n);
  req->prompt_logprobs.append(prompt_lps.data(), n);
  req->prompt_top_token_ids.append(prompt_top_ids.data(), n);
  req->prompt_top_logprobs.append(prompt_top_lps.data(), n);
  req->error.append(errors.data(), n);
  req->t_queued.append(t_queued.data(), n);
  req->t_first_token.append(t_first.data(), n);
  req->t_finished.append(t_finished.data(), n);
  req->replica.append(replicas.data(), n);
  rows_written += static_cast<int64_t>(n);
  pending.clear();
}

void ResultWriter::Impl::write_steps() {
  const size_t n = pending_steps.size();
  if (n == 0) return;
  std::vector<int64_t> step(n);
  std::vector<int32_t> replica(n), batch(n), prefill(n), decode(n), kv(n), running(n), waiting(n);
  std::vector<double> t_start(n), wall(n), dispatch_s(n), combine_s(n);
  std::vector<int64_t> dispatch_bytes(n), combine_bytes(n);
  std::vector<hvl_t> experts(n), stage_compute(n), stage_comm(n);
  for (size_t i = 0; i < n; ++i) {
    const StepRecord& s = pending_steps[i];
    dispatch_s[i] = s.moe_dispatch_s;
    combine_s[i] = s.moe_combine_s;
    dispatch_bytes[i] = s.moe_dispatch_bytes;
    combine_bytes[i] = s.moe_combine_bytes;
    experts[i].len = s.expert_tokens.size();
    experts[i].p = const_cast<int32_t*>(s.expert_tokens.data());
    stage_compute[i] = {s.stage_compute_s.size(), const_cast<double*>(s.stage_compute_s.data())};
    stage_comm[i] = {s.stage_comm_s.size(), const_cast<double*>(s.stage_comm_s.data())};
    step[i] = s.step;
    replica[i] = s.replica;
    batch[i] = s.batch_size;
    prefill[i] = s.prefill_tokens;
    decode[i] = s.decode_tokens;
    kv[i] = s.kv_blocks_used;
    running[i] = s.running;
    waiting[i] = s.waiting;
    t_start[i] = s.t_start;
    wall[i] = s.wall_s;
  }
  steps->step.append(step.data(), n);
  steps->replica.append(replica.data(), n);
  steps->batch_size.append(batch.data(), n);
  steps->prefill_tokens.append(prefill.data(), n);
  steps->decode_tokens.append(decode.data(), n);
  steps->kv_blocks_used.append(kv.data(), n);
  steps->running.append(running.data(), n);
  steps->waiting.append(waiting.data(), n);
  steps->t_start.append(t_start.data(), n);
  steps->wall_s.append(wall.data(), n);
  steps->moe_dispatch_s.append(dispatch_s.data(), n);
  steps->moe_combine_s.append(combine_s.data(), n);
  steps->moe_dispatch_bytes.append(dispatch_bytes.data(), n);
  steps->moe_combine_bytes.append(combine_bytes.data(), n);
  steps->expert_tokens.append(experts.data(), n);
  steps->stage_compute_s.append(stage_compute.data(), n);
  steps->stage_comm_s.append(stage_comm.data(), n);
  pending_steps.clear();
}

void ResultWriter::Impl::release_handles() {
  req.reset();
  steps.reset();
  requests_group.reset();
  steps_group.reset();
}

ResultWriter::ResultWriter(const std::string& path, int flush_every, bool resume, double flush_seconds)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.ctx = "HDF5 output '" + path + "'";
  SHARDLM_CHECK(flush_every >= 1, m.ctx << ": flush_every must be >= 1 (got " << flush_every << ")");
  m.flush_every = static_cast<size_t>(flush_every);
  m.flush_seconds = flush_seconds;
  m.last_flush = std::chrono::steady_clock::now();
  h5::silence_error_printing();
  m.file = resume ? H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)
                  : H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  h5::check(m.file, resume ? "opening the file to resume" : "creating the file", m.ctx);
  m.open = true;
  try {
    if (resume) {
      m.requests_group = h5::Id(H5Gopen2(m.file, "requests", H5P_DEFAULT));
      h5::check(m.requests_group.get(), "opening group /requests", m.ctx);
      m.steps_group = h5::Id(H5Gopen2(m.file, "steps", H5P_DEFAULT));
      h5::check(m.steps_group.get(), "opening group /steps", m.ctx);
      add_list_columns(m.requests_group.get(), "line", ColumnKind::kInt64,
                       {{"top_token_ids", ColumnKind::kVlenInt32},
                        {"top_logprobs", ColumnKind::kVlenFloat32},
                        {"prompt_logprobs", ColumnKind::kVlenFloat32},
                        {"prompt_top_token_ids", ColumnKind::kVlenInt32},
                        {"prompt_top_logprobs", ColumnKind::kVlenFloat32}},
                       m.ctx + " /requests");
      m.req.emplace(m.requests_group.get(), m.ctx + " /requests");
      add_list_columns(m.steps_group.get(), "step", ColumnKind::kInt64,
                       {{"stage_compute_s", ColumnKind::kVlenFloat64}, {"stage_comm_s", ColumnKind::kVlenFloat64}},
                       m.ctx + " /steps");
      m.steps.emplace(m.steps_group.get(), m.ctx + " /steps");
      // A crash between flushes can leave some columns a batch longer than others: keep the rows
      // every column has.
      // Rows past the last commit may hold anything (ResultWriter::Impl::commit).
      auto even_out = [&](std::vector<Column*> cols, const char* group) {
        hsize_t n = cols.front()->size();
        for (Column* c : cols) n = std::min(n, c->size());
        if (const int64_t c = h5::committed_rows(m.file, group); c >= 0) n = std::min(n, static_cast<hsize_t>(c));
        for (Column* c : cols) c->truncate(n);
        return n;
      };
      m.rows_written = static_cast<int64_t>(even_out(m.req->all(), "requests"));
      even_out(m.steps->all(), "steps");
      // /ranks describes the run that writes it: the resumed run writes it anew.
      for (const char* g : {"ranks", "op_profile"}) {
        if (H5Lexists(m.file, g, H5P_DEFAULT) > 0)
          h5::check(H5Ldelete(m.file, g, H5P_DEFAULT), std::string("removing the previous run's /") + g, m.ctx);
      }
    } else {
      m.requests_group = h5::Id(H5Gcreate2(m.file, "requests", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      h5::check(m.requests_group.get(), "creating group /requests", m.ctx);
      m.steps_group = h5::Id(H5Gcreate2(m.file, "steps", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      h5::check(m.steps_group.get(), "creating group /steps", m.ctx);
      m.req.emplace(m.requests_group.get(), m.ctx + " /requests", kChunkRows);
      m.steps.emplace(m.steps_group.get(), m.ctx + " /steps", kChunkRows);
      // Nothing is whole yet: a kill before the first commit (after a step batch was written
      // early, or inside that commit) must not leave rows a resumed run would keep.
      h5::write_attr(m.file, "rows_committed", int64_t{0}, m.ctx);
      h5::write_attr(m.file, "steps_committed", int64_t{0}, m.ctx);
    }
    h5::check(H5Fflush(m.file, H5F_SCOPE_GLOBAL), "H5Fflush", m.ctx);
  } catch (...) {
    m.release_handles();
    H5Fclose(m.file);
    m.open = false;
    throw;
  }
}

std::vector<std::string> ResultWriter::finished_keys(std::vector<std::string>* legacy_keys) const {
  const Impl& m = *impl_;
  const hsize_t n = static_cast<hsize_t>(m.rows_written);
  if (n == 0) return {};
  const hsize_t start = 0;
  h5::Id mem(H5Screate_simple(1, &n, nullptr));
  // The first n rows of a column, into `out` as `type`.
  auto read = [&](const char* name, hid_t type, void* out) {
    h5::Id dset(H5Dopen2(m.requests_group.get(), name, H5P_DEFAULT));
    h5::check(dset.get(), std::string("opening /requests/") + name, m.ctx);
    h5::Id space(H5Dget_space(dset.get()));
    h5::check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr), "H5Sselect_hyperslab",
              m.ctx);
    h5::check(H5Dread(dset.get(), type, mem.get(), space.get(), H5P_DEFAULT, out),
              std::string("reading /requests/") + name, m.ctx);
  };
  h5::Id type = h5::make_utf8_string_type();
  auto strings = [&](const char* name) {
    std::vector<char*> raw(n, nullptr);
    read(name, type.get(), raw.data());
    std::vector<std::string> v;
    v.reserve(n);
    for (char* p : raw) v.emplace_back(p ? p : "");
    H5Dvlen_reclaim(type.get(), mem.get(), H5P_DEFAULT, raw.data());
    return v;
  };
  std::vector<std::string> out = strings("id");
  std::vector<int64_t> line(n);
  read("line", H5T_NATIVE_INT64, line.data());
  const std::vector<std::string> errors = legacy_keys ? strings("error") : std::vector<std::string>();
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) {
      out[i] = request_key(out[i], line[i]);  // a row without an id is known by its line
    } else if (legacy_keys && !errors[i].empty() && out[i] == std::to_string(line[i])) {
      legacy_keys->push_back(request_key("", line[i]));
    }
  }
  return out;
}

ResultWriter::~ResultWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlm: closing the result file failed: %s\n", e.what());
  }
}

void ResultWriter::append(const RequestResult& r) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.open, m.ctx << ": append after close");
  m.pending.push_back(r);
  if (m.pending.size() >= m.flush_every || m.flush_due()) flush();
}

void ResultWriter::write_op_profile(const std::vector<OpProfileRow>& rows) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.open, m.ctx << ": write_op_profile after close");
  h5::Id g(H5Gcreate2(m.file, "op_profile", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  h5::check(g.get(), "creating group /op_profile", m.ctx);
  const std::string ctx = m.ctx + " /op_profile";
  const size_t n = rows.size();
  std::vector<int32_t> rank(n);
  std::vector<int64_t> steps(n), calls(n), bytes(n);
  std::vector<double> seconds(n), step_seconds(n);
  std::vector<const char*> kind(n), section(n);
  for (size_t i = 0; i < n; ++i) {
    rank[i] = rows[i].rank;
    steps[i] = rows[i].steps;
    calls[i] = rows[i].calls;
    bytes[i] = rows[i].bytes;
    seconds[i] = rows[i].seconds;
    step_seconds[i] = rows[i].step_seconds;
    kind[i] = rows[i].kind.c_str();
    section[i] = rows[i].section.c_str();
  }
  h5::Column(g.get(), "rank", h5::ColumnKind::kInt32, 256, ctx).append(rank.data(), n);
  h5::Column(g.get(), "kind", h5::ColumnKind::kString, 256, ctx).append(kind.data(), n);
  h5::Column(g.get(), "section", h5::ColumnKind::kString, 256, ctx).append(section.data(), n);
  h5::Column(g.get(), "steps", h5::ColumnKind::kInt64, 256, ctx).append(steps.data(), n);
  h5::Column(g.get(), "calls", h5::ColumnKind::kInt64, 256, ctx).append(calls.data(), n);
  h5::Column(g.get(), "seconds", h5::ColumnKind::kFloat64, 256, ctx).append(seconds.data(), n);
  h5::Column(g.get(), "step_seconds", h5::ColumnKind::kFloat64, 256, ctx).append(step_seconds.data(), n);
  h5::Column(g.get(), "bytes", h5::ColumnKind::kInt64, 256, ctx).append(bytes.data(), n);
}

void ResultWriter::write_ranks(const std::vector<RankRecord>& ranks) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.open, m.ctx << ": write_ranks after close");
  h5::Id g(H5Gcreate2(m.file, "ranks", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  h5::check(g.get(), "creating group /ranks", m.ctx);
  const std::string ctx = m.ctx + " /ranks";
  const size_t n = ranks.size();
  auto i32 = [&](const char* name, auto field) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = field(ranks[i]);
    h5::Column(g.get(), name, h5::ColumnKind::kInt32, 64, ctx).append(v.data(), n);
  };
  auto i64 = [&](const char* name, auto field) {
    std::vector<int64_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = field(ranks[i]);
    h5::Column(g.get(), name, h5::ColumnKind::kInt64, 64, ctx).append(v.data(), n);
  };
  i32("rank", [](const RankRecord& r) { return r.rank; });
  i32("replica", [](const RankRecord& r) { return r.replica; });
  i32("pp", [](const RankRecord& r) { return r.pp; });
  i32("tp", [](const RankRecord& r) { return r.tp; });
  i32("dp", [](const RankRecord& r) { return r.dp; });
  i32("local_rank", [](const RankRecord& r) { return r.local_rank; });
  i32("device", [](const RankRecord& r) { return r.device; });
  i64("load_bytes", [](const RankRecord& r) { return r.load_bytes; });
  i64("peak_rss_bytes", [](const RankRecord& r) { return r.peak_rss_bytes; });
  i64("tp_bytes_sent", [](const RankRecord& r) { return r.tp_bytes_sent; });
  i64("pp_bytes_sent", [](const RankRecord& r) { return r.pp_bytes_sent; });
  i64("replica_bytes_sent", [](const RankRecord& r) { return r.replica_bytes_sent; });
  i64("ep_bytes_sent", [](const RankRecord& r) { return r.ep_bytes_sent; });
  i64("graph_steps", [](const RankRecord& r) { return r.graph_steps; });
  i64("graph_reruns", [](const RankRecord& r) { return r.graph_reruns; });
  i64("device_weight_bytes", [](const RankRecord& r) { return r.device_weight_bytes; });
  i64("device_used_bytes", [](const RankRecord& r) { return r.device_used_bytes; });
  std::vector<double> load_s(n);
  std::vector<const char*> hosts(n);
  StringBatch strings;
  for (size_t i = 0; i < n; ++i) {
    load_s[i] = ranks[i].load_s;
    hosts[i] = strings.add(ranks[i].host);
  }
  h5::Column(g.get(), "load_s", h5::ColumnKind::kFloat64, 64, ctx).append(load_s.data(), n);
  h5::Column(g.get(), "host", h5::ColumnKind::kString, 64, ctx).append(hosts.data(), n);
}

void ResultWriter::append_step(const StepRecord& s) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.open, m.ctx << ": append_step after close");
  m.pending_steps.push_back(s);
  if (m.flush_due()) {
    flush();
  } else if (m.pending_steps.size() >= kStepBatch) {
    m.write_steps();
  }
}

void ResultWriter::set_attr(const std::string& name, const std::string& value) {
  SHARDLM_CHECK(impl_->open, impl_->ctx << ": set_attr after close");
  h5::write_attr(impl_->file, name, repair_utf8(value), impl_->ctx);
}

void ResultWriter::set_attr(const std::string& name, double value) {
  SHARDLM_CHECK(impl_->open, impl_->ctx << ": set_attr after close");
  h5::write_attr(impl_->file, name, value, impl_->ctx);
}

void ResultWriter::set_attr(const std::string& name, int64_t value) {
  SHARDLM_CHECK(impl_->open, impl_->ctx << ": set_attr after close");
  h5::write_attr(impl_->file, name, value, impl_->ctx);
}

void ResultWriter::set_attr(const std::string& name, uint64_t value) {
  SHARDLM_CHECK(impl_->open, impl_->ctx << ": set_attr after close");
  h5::write_attr(impl_->file, name, value, impl_->ctx);
}

void ResultWriter::remove_attr(const std::string& name) {
  SHARDLM_CHECK(impl_->open, impl_->ctx << ": remove_attr after close");
  const htri_t there = H5Aexists(impl_->file, name.c_str());
  h5::check(there, "looking for attribute " + name, impl_->ctx);
  if (there > 0) h5::check(H5Adelete(impl_->file, name.c_str()), "removing attribute " + name, impl_->ctx);
}

void ResultWriter::flush() {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.open, m.ctx << ": flush after close");
  m.commit();
  m.last_flush = std::chrono::steady_clock::now();
}

void ResultWriter::close() {
  if (!impl_ || !impl_->open) return;
  Impl& m = *impl_;
  std::exception_ptr failure;
  try {
    m.commit();
  } catch (...) {
    failure = std::current_exception();
  }
  m.open = false;
  m.release_handles();
  const herr_t st = H5Fclose(m.file);
  m.file = H5I_INVALID_HID;
  if (failure) std::rethrow_exception(failure);
  h5::check(st, "closing the file", m.ctx);
}

int64_t ResultWriter::rows() const { return impl_->rows_written + static_cast<int64_t>(impl_->pending.size()); }

}  // namespace shardlm
