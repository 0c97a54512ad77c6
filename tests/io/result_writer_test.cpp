// ResultWriter: every value written comes back from the file through the HDF5 C API.
#include "io/result_writer.h"

#include <gtest/gtest.h>

#include <cmath>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "common/h5_read.h"
#include "io_test_util.h"

namespace shardlm {
namespace {

using test::H5Reader;
using test::ScratchDir;

RequestResult make_row(int i) {
  RequestResult r;
  r.id = "req-" + std::to_string(i);
  r.line = i + 1;
  for (int k = 0; k < i % 7; ++k) r.prompt_tokens.push_back(i * 10 + k);
  for (int k = 0; k < i % 5; ++k) {
    r.output_tokens.push_back(1000 + i + k);
    r.token_logprobs.push_back(-0.25f * static_cast<float>(k + 1));
  }
  r.output_text = "text " + std::to_string(i);
  r.finish_reason = i % 2 ? FinishReason::kStop : FinishReason::kLength;
  r.replica = i % 3;
  r.t_queued = 0.5 * i;
  r.t_first_token = 0.5 * i + 0.125;
  r.t_finished = 0.5 * i + 1.0;
  return r;
}

// Rows whose values are awkward: empty lists and strings, non-ASCII text, an error row, bad UTF-8.
std::vector<RequestResult> special_rows() {
  std::vector<RequestResult> rows(4);
  rows[0].id = "empty";
  rows[0].line = 1;
  rows[0].finish_reason = FinishReason::kLength;  // nothing generated (an earlier build's max_tokens 0)
  rows[1].id = "caf\xC3\xA9-\xE4\xB8\x96\xE7\x95\x8C";
  rows[1].line = 2;
  rows[1].prompt_tokens = {1, 2, 3};
  rows[1].output_tokens = {-1 + 2147483647, 0, 7};
  rows[1].token_logprobs = {-0.0f, -1.5f, -30.75f};
  rows[1].output_text = "Gr\xC3\xBC\xC3\x9F" "e \xF0\x9F\x99\x82 \xE4\xBD\xA0\xE5\xA5\xBD\n\ttab";
  rows[1].finish_reason = FinishReason::kStop;
  rows[1].replica = 3;
  rows[1].t_queued = 1.0 / 3.0;
  rows[1].t_first_token = 1e-9;
  rows[1].t_finished = 12345.678901234;
  rows[2].id = "7";
  rows[2].line = 7;
  rows[2].finish_reason = FinishReason::kError;
  rows[2].error = "line 7: field 'temperature' must be a number";
  rows[3].id = "partial";
  rows[3].line = 9;
  rows[3].output_tokens = {5};
  rows[3].token_logprobs = {-2.0f};
  rows[3].output_text = "cut \xE4\xBD";  // a character cut in half by max_tokens
  rows[3].finish_reason = FinishReason::kAbort;
  return rows;
}

void expect_special_rows(const H5Reader& f, size_t offset) {
  const auto want = special_rows();
  const auto ids = f.strings("/requests/id");
  const auto texts = f.strings("/requests/output_text");
  const auto reasons = f.strings("/requests/finish_reason");
  const auto errors = f.strings("/requests/error");
  const auto lines = f.scalars<int64_t>("/requests/line", H5T_NATIVE_INT64);
  const auto replicas = f.scalars<int32_t>("/requests/replica", H5T_NATIVE_INT32);
  const auto tq = f.scalars<double>("/requests/t_queued", H5T_NATIVE_DOUBLE);
  const auto tf = f.scalars<double>("/requests/t_first_token", H5T_NATIVE_DOUBLE);
  const auto te = f.scalars<double>("/requests/t_finished", H5T_NATIVE_DOUBLE);
  const auto ptoks = f.lists<int32_t>("/requests/prompt_tokens", H5T_NATIVE_INT32);
  const auto otoks = f.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
  const auto lps = f.lists<float>("/requests/token_logprobs", H5T_NATIVE_FLOAT);
  ASSERT_GE(ids.size(), offset + want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const size_t j = offset + i;
    const RequestResult& w = want[i];
    EXPECT_EQ(ids[j], w.id);
    EXPECT_EQ(lines[j], w.line);
    EXPECT_EQ(ptoks[j], w.prompt_tokens) << w.id;
    EXPECT_EQ(otoks[j], w.output_tokens) << w.id;
    EXPECT_EQ(lps[j], w.token_logprobs) << w.id;
    EXPECT_EQ(reasons[j], finish_reason_name(w.finish_reason));
    EXPECT_EQ(errors[j], w.error);
    EXPECT_EQ(replicas[j], w.replica);
    EXPECT_EQ(tq[j], w.t_queued);
    EXPECT_EQ(tf[j], w.t_first_token);
    EXPECT_EQ(te[j], w.t_finished);
    if (w.id == "partial") {
      EXPECT_EQ(texts[j], "cut \xEF\xBF\xBD");  // ill-formed UTF-8 stored as U+FFFD
    } else {
      EXPECT_EQ(texts[j], w.output_text);
    }
  }
}

TEST(ResultWriter, RoundTripsEveryColumnAndAttribute) {
  ScratchDir dir;
  const std::string path = dir.file("out.h5");
  constexpr int kBulk = 700;  // several 256-row chunks, with flush_every not dividing it
  {
    ResultWriter w(path, 64);
    for (const auto& r : special_rows()) w.append(r);
    for (int i = 0; i < kBulk; ++i) w.append(make_row(i));
    EXPECT_EQ(w.rows(), 4 + kBulk);
    for (int s = 0; s < 3; ++s) {
      StepRecord st;
      st.step = s;
      st.batch_size = 8 + s;
      st.prefill_tokens = 100 * s;
      st.decode_tokens = 8 - s;
      st.kv_blocks_used = 40 + s;
      st.t_start = 0.01 * s;
      st.wall_s = 0.005 + s;
      for (int k = 0; k < s; ++k) {  // s stages: 0, 1, 2
        st.stage_compute_s.push_back(0.25 * (k + 1) + s);
        st.stage_comm_s.push_back(1.0 / 3.0 + k);
      }
      w.append_step(st);
    }
    w.set_attr("model", std::string("stories260K \xE2\x80\x94 tiny"));
    w.set_attr("command_line", std::string("shardlm --prompts inputs/prompts.jsonl"));
    w.set_attr("tokens_per_s", 1234.5);
    w.set_attr("seed", int64_t{-42});
    w.set_attr("seed", int64_t{1234567890123});  // set twice: the last value wins
    w.close();
    w.close();  // idempotent
    EXPECT_THROW(w.append(make_row(0)), Error);
  }
  H5Reader f(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f.rows("/requests/id"), 4u + kBulk);
  for (const char* col : {"line", "prompt_tokens", "output_tokens", "output_text", "finish_reason", "token_logprobs",
                          "top_token_ids", "top_logprobs", "prompt_logprobs", "prompt_top_token_ids",
                          "prompt_top_logprobs", "error", "t_queued", "t_first_token", "t_finished", "replica"})
    EXPECT_EQ(f.rows(std::string("/requests/") + col), 4u + kBulk) << col;
  expect_special_rows(f, 0);

  const auto ids = f.strings("/requests/id");
  const auto otoks = f.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
  const auto lps = f.lists<float>("/requests/token_logprobs", H5T_NATIVE_FLOAT);
  const auto reasons = f.strings("/requests/finish_reason");
  const auto te = f.scalars<double>("/requests/t_finished", H5T_NATIVE_DOUBLE);
  const auto ptoks = f.lists<int32_t>("/requests/prompt_tokens", H5T_NATIVE_INT32);
  for (int i = 0; i < kBulk; ++i) {
    const RequestResult w = make_row(i);
    const size_t j = 4 + static_cast<size_t>(i);
    ASSERT_EQ(ids[j], w.id);
    ASSERT_EQ(otoks[j], w.output_tokens) << i;
    ASSERT_EQ(ptoks[j], w.prompt_tokens) << i;
    ASSERT_EQ(lps[j], w.token_logprobs) << i;
    ASSERT_EQ(reasons[j], finish_reason_name(w.finish_reason));
    ASSERT_EQ(te[j], w.t_finished);
  }

  EXPECT_EQ(f.rows("/steps/step"), 3u);
  EXPECT_EQ(f.scalars<int64_t>("/steps/step", H5T_NATIVE_INT64), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(f.scalars<int32_t>("/steps/batch_size", H5T_NATIVE_INT32), (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(f.scalars<int32_t>("/steps/prefill_tokens", H5T_NATIVE_INT32), (std::vector<int32_t>{0, 100, 200}));
  EXPECT_EQ(f.scalars<int32_t>("/steps/decode_tokens", H5T_NATIVE_INT32), (std::vector<int32_t>{8, 7, 6}));
  EXPECT_EQ(f.scalars<int32_t>("/steps/kv_blocks_used", H5T_NATIVE_INT32), (std::vector<int32_t>{40, 41, 42}));
  EXPECT_EQ(f.scalars<double>("/steps/t_start", H5T_NATIVE_DOUBLE), (std::vector<double>{0.0, 0.01, 0.02}));
  EXPECT_EQ(f.scalars<double>("/steps/wall_s", H5T_NATIVE_DOUBLE), (std::vector<double>{0.005, 1.005, 2.005}));
  EXPECT_EQ(f.lists<double>("/steps/stage_compute_s", H5T_NATIVE_DOUBLE),
            (std::vector<std::vector<double>>{{}, {1.25}, {2.25, 2.5}}));
  EXPECT_EQ(f.lists<double>("/steps/stage_comm_s", H5T_NATIVE_DOUBLE),
            (std::vector<std::vector<double>>{{}, {1.0 / 3.0}, {1.0 / 3.0, 4.0 / 3.0}}));

  EXPECT_EQ(f.string_attr("model"), "stories260K \xE2\x80\x94 tiny");
  EXPECT_EQ(f.string_attr("command_line"), "shardlm --prompts inputs/prompts.jsonl");
  EXPECT_EQ(f.scalar_attr<double>("tokens_per_s", H5T_NATIVE_DOUBLE), 1234.5);
  EXPECT_EQ(f.scalar_attr<int64_t>("seed", H5T_NATIVE_INT64), 1234567890123);
}

TEST(ResultWriter, ColumnTypesAreWhatReadersExpect) {
  ScratchDir dir;
  const std::string path = dir.file("types.h5");
  {
    ResultWriter w(path);
    w.append(make_row(3));
  }
  H5Reader f(path);
  ASSERT_TRUE(f.ok());
  auto type_of = [&](const char* dset) {
    hid_t d = H5Dopen2(f.id(), dset, H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    H5Dclose(d);
    return t;
  };
  for (const char* s : {"/requests/id", "/requests/output_text", "/requests/finish_reason", "/requests/error"}) {
    hid_t t = type_of(s);
    EXPECT_EQ(H5Tget_class(t), H5T_STRING) << s;
    EXPECT_GT(H5Tis_variable_str(t), 0) << s;
    EXPECT_EQ(H5Tget_cset(t), H5T_CSET_UTF8) << s;
    H5Tclose(t);
  }
  for (const char* s : {"/requests/prompt_tokens", "/requests/output_tokens", "/requests/token_logprobs"}) {
    hid_t t = type_of(s);
    EXPECT_EQ(H5Tget_class(t), H5T_VLEN) << s;
    hid_t base = H5Tget_super(t);
    EXPECT_EQ(H5Tget_size(base), 4u) << s;
    EXPECT_EQ(H5Tget_class(base), std::string(s).find("logprobs") != std::string::npos ? H5T_FLOAT : H5T_INTEGER);
    H5Tclose(base);
    H5Tclose(t);
  }
  struct Want {
    const char* dset;
    H5T_class_t cls;
    size_t size;
  };
  for (const Want& w : {Want{"/requests/line", H5T_INTEGER, 8}, Want{"/requests/replica", H5T_INTEGER, 4},
                        Want{"/requests/t_queued", H5T_FLOAT, 8}, Want{"/steps/step", H5T_INTEGER, 8},
                        Want{"/steps/batch_size", H5T_INTEGER, 4}, Want{"/steps/wall_s", H5T_FLOAT, 8}}) {
    hid_t t = type_of(w.dset);
    EXPECT_EQ(H5Tget_class(t), w.cls) << w.dset;
    EXPECT_EQ(H5Tget_size(t), w.size) << w.dset;
    H5Tclose(t);
  }
  // Chunked and extendable without limit.
  hid_t d = H5Dopen2(f.id(), "/requests/output_tokens", H5P_DEFAULT);
  hid_t plist = H5Dget_create_plist(d);
  hsize_t chunk = 0;
  EXPECT_EQ(H5Pget_chunk(plist, 1, &chunk), 1);
  EXPECT_EQ(chunk, 256u);
  hid_t space = H5Dget_space(d);
  hsize_t cur = 0, max = 0;
  H5Sget_simple_extent_dims(space, &cur, &max);
  EXPECT_EQ(cur, 1u);
  EXPECT_EQ(max, H5S_UNLIMITED);
  H5Sclose(space);
  H5Pclose(plist);
  H5Dclose(d);
}

TEST(ResultWriter, FlushedRowsAreReadableWhileTheWriterIsOpen) {
  ScratchDir dir;
  const std::string path = dir.file("live.h5");
  const std::string snapshot = dir.file("crash_copy.h5");
  ResultWriter w(path, 1000);
  for (const auto& r : special_rows()) w.append(r);
  for (int i = 0; i < 6; ++i) w.append(make_row(i));
  w.flush();

  // (1) What is on disk now, copied as a crash would leave it: a second process's view.
  std::filesystem::copy_file(path, snapshot);
  {
    H5Reader f(snapshot);
    ASSERT_TRUE(f.ok()) << "a file flushed and then abandoned must open";
    EXPECT_EQ(f.rows("/requests/id"), 10u);
    expect_special_rows(f, 0);
  }
  // (2) A second read-only handle on the live file in this process (HDF5 shares the open file, so
  // this checks the handle works, not what is on disk: (1) and the h5py test check that).
  {
    H5Reader f(path);
    ASSERT_TRUE(f.ok()) << "second read-only handle on the open file";
    EXPECT_EQ(f.rows("/requests/output_tokens"), 10u);
    expect_special_rows(f, 0);
  }
  // Rows appended after the flush and not yet flushed are not on disk.
  w.append(make_row(100));
  std::filesystem::copy_file(path, snapshot, std::filesystem::copy_options::overwrite_existing);
  {
    H5Reader f(snapshot);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f.rows("/requests/id"), 10u);
  }
  w.close();
  H5Reader f(path);
  EXPECT_EQ(f.rows("/requests/id"), 11u);
  EXPECT_EQ(f.strings("/requests/id").back(), "req-100");
}

TEST(ResultWriter, AutoFlushEveryNRows) {
  ScratchDir dir;
  const std::string path = dir.file("auto.h5");
  const std::string snapshot = dir.file("copy.h5");
  ResultWriter w(path, 4);
  for (int i = 0; i < 9; ++i) w.append(make_row(i));
  EXPECT_EQ(w.rows(), 9);
  std::filesystem::copy_file(path, snapshot);
  H5Reader f(snapshot);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f.rows("/requests/id"), 8u);  // two automatic flushes of 4; the ninth row is buffered
  EXPECT_EQ(f.strings("/requests/id")[7], "req-7");
}

// A run killed inside HDF5 between flushes can leave the datasets' new extent on disk without
// their rows. Here every /requests column of a closed file grows by two rows nobody wrote: a
// resumed writer keeps the six committed rows only.
// Grows every dataset of `group` by `more` rows, as a kill can leave a dataset whose new extent
// reached the disk before its rows did.
void extend_datasets(const std::string& path, const char* group, hsize_t more) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t g = H5Gopen2(f, group, H5P_DEFAULT);
  H5G_info_t info;
  ASSERT_GE(H5Gget_info(g, &info), 0);
  ASSERT_GT(info.nlinks, 0u) << group;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256];
    ASSERT_GT(H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT), 0);
    const hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    const hid_t space = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    n += more;
    EXPECT_GE(H5Dset_extent(d, &n), 0) << name;
    H5Sclose(space);
    H5Dclose(d);
  }
  H5Gclose(g);
  H5Fclose(f);
}

// On resume every row is known by its request_key: a row without an id by its line. An error row
// whose id is its line number (how an older version wrote a line it could not read) also gives the
// line's key, so that the line does not get a second row.
TEST(ResultWriter, FinishedKeysKnowRowsWithoutAnIdByTheirLine) {
  ScratchDir dir;
  const std::string path = dir.file("keys.h5");
  {
    ResultWriter w(path);
    RequestResult ok = make_row(0), unread = make_row(1), old = make_row(2), line_id = make_row(3);
    ok.id = "7";  // an id that is a number, on another line
    ok.line = 1;
    unread.id = "";
    unread.line = 2;
    unread.error = "line 2: not valid JSON (x)";
    old.id = "3";
    old.line = 3;
    old.error = "line 3: not valid JSON (x)";
    line_id.id = "4";  // a line without an id field that ran: its id is its number
    line_id.line = 4;
    line_id.error = "";
    for (const RequestResult& r : {ok, unread, old, line_id}) w.append(r);
  }
  ResultWriter w(path, 64, /*resume=*/true);
  std::vector<std::string> legacy;
  EXPECT_EQ(w.finished_keys(&legacy), (std::vector<std::string>{"7", request_key("", 2), "3", "4"}));
  EXPECT_EQ(legacy, std::vector<std::string>{request_key("", 3)});
  EXPECT_NE(request_key("", 7), "7");
}

TEST(ResultWriter, ResumeKeepsOnlyCommittedRows) {
  ScratchDir dir;
  const std::string path = dir.file("torn.h5");
  {
    ResultWriter w(path, 100);
    for (int i = 0; i < 6; ++i) w.append(make_row(i));
  }
  extend_datasets(path, "requests", 2);
  EXPECT_EQ(H5Reader(path).rows("/requests/id"), 8u);
  ResultWriter w(path, 100, /*resume=*/true);
  EXPECT_EQ(w.rows(), 6);
  const std::vector<std::string> ids = w.finished_keys();
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(ids.back(), "req-5");
  w.append(make_row(6));
  w.close();
  H5Reader f(path);
  EXPECT_EQ(f.rows("/requests/id"), 7u);
  EXPECT_EQ(f.strings("/requests/id").back(), "req-6");
  EXPECT_EQ(f.scalar_attr<int64_t>("rows_committed", H5T_NATIVE_INT64), 7);
}

// A file written before /steps had the stage columns is resumed: the columns are added with an
// empty row for each step already there, and the new steps' rows follow.
TEST(ResultWriter, ResumeAddsTheStageColumnsToAnOlderFile) {
  ScratchDir dir;
  const std::string path = dir.file("older.h5");
  StepRecord st;
  st.stage_compute_s = {0.5, 0.75};
  st.stage_comm_s = {0.125, 0.25};
  {
    ResultWriter w(path, 100);
    w.append(make_row(0));
    for (int s = 0; s < 2; ++s) {
      st.step = s;
      w.append_step(st);
    }
  }
  {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    EXPECT_GE(H5Ldelete(f, "/steps/stage_compute_s", H5P_DEFAULT), 0);
    EXPECT_GE(H5Ldelete(f, "/steps/stage_comm_s", H5P_DEFAULT), 0);
    H5Fclose(f);
  }
  {
    ResultWriter w(path, 100, /*resume=*/true);
    st.step = 2;
    w.append_step(st);
  }
  H5Reader f(path);
  EXPECT_EQ(f.rows("/steps/step"), 3u);
  EXPECT_EQ(f.lists<double>("/steps/stage_compute_s", H5T_NATIVE_DOUBLE),
            (std::vector<std::vector<double>>{{}, {}, {0.5, 0.75}}));
  EXPECT_EQ(f.lists<double>("/steps/stage_comm_s", H5T_NATIVE_DOUBLE),
            (std::vector<std::vector<double>>{{}, {}, {0.125, 0.25}}));
}

// The logprobs and prompt_logprobs columns round-trip; a file written before them is resumed with
// the columns added, an empty list for each row already there.
TEST(ResultWriter, ResumeAddsTheLogprobColumnsToAnOlderFile) {
  ScratchDir dir;
  const std::string path = dir.file("older.h5");
  const char* const added[] = {"top_token_ids", "top_logprobs", "prompt_logprobs", "prompt_top_token_ids",
                               "prompt_top_logprobs"};
  {
    ResultWriter w(path, 100);
    w.append(make_row(0));
  }
  {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (const char* name : added) EXPECT_GE(H5Ldelete(f, (std::string("/requests/") + name).c_str(), H5P_DEFAULT), 0);
    H5Fclose(f);
  }
  RequestResult r = make_row(1);
  r.top_token_ids = {4, 2, 9, 1};
  r.top_logprobs = {-0.5f, -1.25f, -0.75f, -2.0f};
  r.prompt_logprobs = {NAN, -3.5f};
  r.prompt_top_token_ids = {-1, 6};
  r.prompt_top_logprobs = {NAN, -0.125f};
  {
    ResultWriter w(path, 100, /*resume=*/true);
    w.append(r);
  }
  H5Reader f(path);
  EXPECT_EQ(f.rows("/requests/id"), 2u);
  EXPECT_EQ(f.lists<int32_t>("/requests/top_token_ids", H5T_NATIVE_INT32),
            (std::vector<std::vector<int32_t>>{{}, {4, 2, 9, 1}}));
  EXPECT_EQ(f.lists<float>("/requests/top_logprobs", H5T_NATIVE_FLOAT),
            (std::vector<std::vector<float>>{{}, {-0.5f, -1.25f, -0.75f, -2.0f}}));
  EXPECT_EQ(f.lists<int32_t>("/requests/prompt_top_token_ids", H5T_NATIVE_INT32),
            (std::vector<std::vector<int32_t>>{{}, {-1, 6}}));
  const auto prompt = f.lists<float>("/requests/prompt_logprobs", H5T_NATIVE_FLOAT);
  ASSERT_EQ(prompt.size(), 2u);
  EXPECT_TRUE(prompt[0].empty());
  ASSERT_EQ(prompt[1].size(), 2u);
  EXPECT_TRUE(std::isnan(prompt[1][0]));
  EXPECT_EQ(prompt[1][1], -3.5f);
  EXPECT_EQ(f.lists<float>("/requests/prompt_top_logprobs", H5T_NATIVE_FLOAT)[1][1], -0.125f);
}

// A run killed before its first commit (while a full step batch was being written early, or
// inside that commit): a new file says from its creation that no row is whole yet, so a resumed
// run keeps none of the rows a torn write left.
TEST(ResultWriter, AFileKilledBeforeItsFirstCommitKeepsNothing) {
  ScratchDir dir;
  const std::string path = dir.file("early.h5");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ResultWriter w(path, 100);
    for (int i = 0; i < 3; ++i) w.append(make_row(i));  // buffered: fewer than flush_every
    _exit(0);                                           // no destructor, no commit: as a kill leaves it
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  extend_datasets(path, "steps", 5);
  extend_datasets(path, "requests", 2);
  {
    H5Reader f(path);
    EXPECT_EQ(f.scalar_attr<int64_t>("rows_committed", H5T_NATIVE_INT64), 0);
    EXPECT_EQ(f.scalar_attr<int64_t>("steps_committed", H5T_NATIVE_INT64), 0);
    EXPECT_EQ(f.rows("/steps/step"), 5u);
    EXPECT_EQ(f.rows("/requests/id"), 2u);
  }
  ResultWriter w(path, 100, /*resume=*/true);
  EXPECT_EQ(w.rows(), 0);
  EXPECT_TRUE(w.finished_keys().empty());
  w.close();
  H5Reader f(path);
  EXPECT_EQ(f.rows("/steps/step"), 0u);
  EXPECT_EQ(f.rows("/requests/id"), 0u);
}

TEST(ResultWriter, DestructorWritesBufferedRows) {
  ScratchDir dir;
  const std::string path = dir.file("dtor.h5");
  {
    ResultWriter w(path, 100);
    w.append(make_row(1));
    w.append(make_row(2));
  }
  H5Reader f(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f.strings("/requests/id"), (std::vector<std::string>{"req-1", "req-2"}));
}

// HDF5's strings end at a NUL: a NUL byte in the output text (a byte-fallback <0x00> token) is
// written as U+FFFD, and the text after it is kept.
TEST(ResultWriter, NulInTheTextDoesNotCutItShort) {
  ScratchDir dir;
  const std::string path = dir.file("nul.h5");
  {
    ResultWriter w(path);
    RequestResult r = make_row(1);
    r.output_text = std::string("a\0b\0", 4) + "c";
    w.append(r);
  }
  H5Reader f(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f.strings("/requests/output_text"), (std::vector<std::string>{"a\xEF\xBF\xBD"
                                                                          "b\xEF\xBF\xBD"
                                                                          "c"}));
}

TEST(ResultWriter, UnwritablePathNamesThePath) {
  ScratchDir dir;
  for (const std::string& bad : {dir.file("no/such/dir/out.h5"), dir.path()}) {
    try {
      ResultWriter w(bad);
      FAIL() << "no exception for " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("creating the file failed"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(ResultWriter(dir.file("x.h5"), 0), Error);
}

// The file as Python users read it, from another process: first while the writer still holds it
// (after flush(), with HDF5_USE_FILE_LOCKING=FALSE), then after close. Skipped without h5py.
TEST(ResultWriter, ReadableWithH5py) {
  if (std::system("python3 -c 'import h5py' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 with h5py not available";
  ScratchDir dir;
  const std::string path = dir.file("py.h5");
  const std::string script = dir.file("check.py");
  test::write_file(script,
                   "import sys, h5py, numpy as np\n"
                   "f = h5py.File(sys.argv[1], 'r')\n"
                   "assert len(f['requests/id']) == int(sys.argv[2]), len(f['requests/id'])\n"
                   "t = f['requests/output_tokens'][1]\n"
                   "assert t.dtype == np.int32 and list(t) == [2147483646, 0, 7], t\n"
                   "assert len(f['requests/output_tokens'][0]) == 0\n"
                   "assert f['requests/id'][1].decode() == 'caf\\u00e9-\\u4e16\\u754c'\n"
                   "assert f['requests/id'].asstr()[0] == 'empty'\n"
                   "assert f['requests/error'].asstr()[2].startswith('line 7:')\n"
                   "assert f['requests/finish_reason'].asstr()[:4].tolist() == ['length', 'stop', 'error', 'abort']\n"
                   "assert abs(f['requests/token_logprobs'][1][2] + 30.75) < 1e-6\n"
                   "assert f.attrs['model'] in ('stories260K', b'stories260K') and f.attrs['seed'] == 7\n"
                   "print('h5py ok:', len(f['requests/id']), 'rows')\n");
  ResultWriter w(path, 1000);
  for (const auto& r : special_rows()) w.append(r);
  w.set_attr("model", std::string("stories260K"));
  w.set_attr("seed", int64_t{7});
  w.flush();
  w.append(make_row(5));  // buffered, not yet on disk
  const std::string live = "HDF5_USE_FILE_LOCKING=FALSE python3 " + script + " " + path + " 4";
  EXPECT_EQ(std::system(live.c_str()), 0) << live;
  w.close();
  const std::string closed = "python3 " + script + " " + path + " 5";
  EXPECT_EQ(std::system(closed.c_str()), 0) << closed;
}

}  // namespace
}  // namespace shardlm
