// shardlm merge: runs over disjoint line ranges of a prompt file (the shards of a Slurm job array)
// merged into one file equal one run over the whole file, id for id: line, prompt and output tokens,
// log-probs, text, finish reason, error. `shardlm report` reads the merged file; overlapping inputs
// and an output that is also an input are refused. Shards are cut as slurm/split_prompts.py cuts
// them (earlier lines left blank, so line numbers and the ids derived from them stay); the script
// itself is run too when python3 is there. Uses the tiny random-weight model of `shardlm make-model`.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/test_files.h"
#include "io/h5_util.h"
#include "io/result_writer.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::Proc;
using test::sh;

// Everything a request row holds but its timing and replica.
struct Row {
  int64_t line = 0;
  std::vector<int32_t> prompt, output;
  std::vector<float> logprobs;
  std::string text, finish, error;
  bool operator==(const Row&) const = default;
};

std::map<std::string, Row> read_rows(const fs::path& h5) {
  test::H5Reader h(h5.string());
  EXPECT_TRUE(h.ok()) << h5;
  const auto ids = h.strings("/requests/id");
  const auto lines = h.scalars<int64_t>("/requests/line", H5T_NATIVE_INT64);
  const auto prompts = h.lists<int32_t>("/requests/prompt_tokens", H5T_NATIVE_INT32);
  const auto outputs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
  const auto logprobs = h.lists<float>("/requests/token_logprobs", H5T_NATIVE_FLOAT);
  const auto texts = h.strings("/requests/output_text");
  const auto finishes = h.strings("/requests/finish_reason");
  const auto errors = h.strings("/requests/error");
  std::map<std::string, Row> rows;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(rows.count(ids[i]), 0u) << "id " << ids[i] << " twice in " << h5;
    rows[ids[i]] = Row{lines[i], prompts[i], outputs[i], logprobs[i], texts[i], finishes[i], errors[i]};
  }
  return rows;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::istringstream in(test::read_file(p.string()));
  std::vector<std::string> v;
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// Lines [first, last] (1-based) of `lines`, at their own line numbers: the earlier ones blank.
std::string shard(const std::vector<std::string>& lines, size_t first, size_t last) {
  std::string s(first - 1, '\n');
  for (size_t i = first; i <= last; ++i) s += lines[i - 1] + "\n";
  return s;
}

class Merge : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test::fresh_dir("merge"));
    Proc m = sh(bin() + " make-model --config " + src("inputs/models/tiny-llama.json") + " --out " +
                (*dir_ / "model").string() + " --dtype bf16 --seed 1");
    ASSERT_EQ(m.code, 0) << m.out;
    const auto lines = lines_of(src("inputs/prompts.jsonl"));
    ASSERT_GT(lines.size(), 4u);
    const size_t half = lines.size() / 2;
    test::write_file(*dir_ / "a.jsonl", shard(lines, 1, half));
    test::write_file(*dir_ / "b.jsonl", shard(lines, half + 1, lines.size()));
    run(src("inputs/prompts.jsonl"), "full.h5");
    run((*dir_ / "a.jsonl").string(), "a.h5");
    // Two replicas: the layout does not matter. b alone is profiled: merge keeps its /op_profile.
    run((*dir_ / "b.jsonl").string(), "b.h5", 2, "--op-profile");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static std::string bin() { return test::shardlm_bin(); }
  static std::string src(const std::string& rel) { return std::string(SHARDLM_SOURCE_DIR) + "/" + rel; }
  static std::string at(const std::string& name) { return (*dir_ / name).string(); }
  static void run(const std::string& prompts, const std::string& out, int np = 1, const std::string& more = "") {
    const std::string launch = np > 1 ? test::mpirun(np) : "";
    Proc p = sh(launch + bin() + " run --config " + src("jobs/tiny.ini") + " --model " + at("model") + " --prompts " +
                prompts + " --out " + at(out) + " --threads 1 -q " + more);
    ASSERT_EQ(p.code, 0) << p.out;
  }
  static Proc merge(const std::string& args) { return sh(bin() + " merge " + args); }

  static fs::path* dir_;
};

fs::path* Merge::dir_ = nullptr;

TEST_F(Merge, HalvesMergedEqualOneRunIdForIdTokenForToken) {
  Proc p = merge(at("m.h5") + " " + at("a.h5") + " " + at("b.h5"));
  ASSERT_EQ(p.code, 0) << p.out;
  const auto full = read_rows(at("full.h5"));
  const auto merged = read_rows(at("m.h5"));
  EXPECT_EQ(merged.size(), lines_of(src("inputs/prompts.jsonl")).size());
  ASSERT_EQ(merged.size(), full.size());
  for (const auto& [id, row] : full) {
    ASSERT_EQ(merged.count(id), 1u) << id;
    EXPECT_EQ(merged.at(id), row) << "request " << id << " (line " << row.line << ")";
  }
  // Rows come input by input: a's then b's.
  test::H5Reader a(at("a.h5")), m(at("m.h5"));
  const auto a_ids = a.strings("/requests/id"), m_ids = m.strings("/requests/id");
  EXPECT_TRUE(std::equal(a_ids.begin(), a_ids.end(), m_ids.begin()));
}

TEST_F(Merge, ReportReadsTheMergedFileAndItsSummaryIsRecomputed) {
  ASSERT_EQ(merge(at("r.h5") + " " + at("a.h5") + " " + at("b.h5")).code, 0);
  Proc p = sh(bin() + " report " + at("r.h5") + " --json");
  ASSERT_EQ(p.code, 0) << p.out;
  const auto j = nlohmann::json::parse(p.out.substr(p.out.find('{')));
  test::H5Reader full(at("full.h5")), r(at("r.h5"));
  const int64_t requests = full.scalar_attr<int64_t>("requests", H5T_NATIVE_INT64);
  EXPECT_EQ(j["requests"]["total"].get<int64_t>(), requests);
  EXPECT_EQ(j["requests"]["output_tokens"].get<int64_t>(), full.scalar_attr<int64_t>("output_tokens", H5T_NATIVE_INT64));
  EXPECT_TRUE(j["run"]["finished"].get<bool>());
  EXPECT_FALSE(j["run"]["interrupted"].get<bool>());
  EXPECT_EQ(j["ranks"].size(), 3u);  // a's rank and b's two
  // The attributes a run writes, recomputed over both inputs.
  EXPECT_EQ(r.scalar_attr<int64_t>("requests", H5T_NATIVE_INT64), requests);
  EXPECT_EQ(r.scalar_attr<int64_t>("output_tokens", H5T_NATIVE_INT64),
            full.scalar_attr<int64_t>("output_tokens", H5T_NATIVE_INT64));
  EXPECT_EQ(r.scalar_attr<int64_t>("prompt_tokens", H5T_NATIVE_INT64),
            full.scalar_attr<int64_t>("prompt_tokens", H5T_NATIVE_INT64));
  EXPECT_EQ(r.scalar_attr<int64_t>("merged_from", H5T_NATIVE_INT64), 2);
  EXPECT_GT(r.scalar_attr<double>("wall_seconds", H5T_NATIVE_DOUBLE), 0);
  EXPECT_EQ(r.string_attr("model_config_hash"), full.string_attr("model_config_hash"));
  // An input's session attributes say nothing of the merged rows (the report would read them).
  for (const char* name : {"sessions", "session_rows_before", "wall_seconds_before", "session_start_time"}) {
    EXPECT_TRUE(test::H5Reader(at("a.h5")).has_attr(name)) << name;
    EXPECT_FALSE(r.has_attr(name)) << name;
  }
  EXPECT_EQ(j["comm"]["session_output_tokens"], j["requests"]["output_tokens"]);
  EXPECT_NE(r.string_attr("command_line").find(" merge "), std::string::npos);
  const auto inputs = nlohmann::json::parse(r.string_attr("merge_inputs"));
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0]["path"], at("a.h5"));
  EXPECT_EQ(inputs[0]["requests"]["first_row"], 0);
  EXPECT_EQ(inputs[1]["requests"]["first_row"], inputs[0]["requests"]["rows"]);
  EXPECT_EQ(inputs[0]["requests"]["rows"].get<int64_t>() + inputs[1]["requests"]["rows"].get<int64_t>(), requests);
  EXPECT_EQ(inputs[1]["ranks"]["rows"], 2);
  // /op_profile: b's rows, after a's none.
  test::H5Reader b(at("b.h5"));
  const hsize_t b_ops = b.rows("/op_profile/section");
  EXPECT_GT(b_ops, 0u);
  EXPECT_EQ(r.rows("/op_profile/section"), b_ops);
  EXPECT_EQ(r.strings("/op_profile/section"), b.strings("/op_profile/section"));
  EXPECT_EQ(inputs[0]["op_profile"]["rows"], 0);
  EXPECT_EQ(inputs[1]["op_profile"]["rows"].get<hsize_t>(), b_ops);
  ASSERT_TRUE(j.contains("op_profile"));
  // (A replica that claimed no prompt line ran no step: 1 or 2 ranks.)
  EXPECT_GE(j["op_profile"][0]["ranks"].get<int64_t>(), 1);
  EXPECT_LE(j["op_profile"][0]["ranks"].get<int64_t>(), 2);
  EXPECT_TRUE(inputs[1]["finished"].get<bool>());
  EXPECT_NE(inputs[1]["attributes"]["config"].get<std::string>().find("prompts = " + at("b.jsonl")), std::string::npos);
}

// An input that was resumed keeps the /ranks of its last session only: the merged file's bytes per
// output token divide by those sessions' tokens (here a's rows from the third on, and all of
// b's), not by every row's. (a's session attributes are set by hand: a resumed run writes them.)
TEST_F(Merge, CommPerTokenOfAResumedInputIsItsLastSessions) {
  fs::copy_file(at("a.h5"), at("a-resumed.h5"), fs::copy_options::overwrite_existing);
  {
    const hid_t f = H5Fopen(at("a-resumed.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    h5::write_attr(f, "sessions", int64_t{2}, "a-resumed.h5");
    h5::write_attr(f, "session_rows_before", int64_t{2}, "a-resumed.h5");
    H5Fclose(f);
  }
  ASSERT_EQ(merge(at("rm.h5") + " " + at("a-resumed.h5") + " " + at("b.h5")).code, 0);
  int64_t want = 0, all = 0;
  for (const char* f : {"a-resumed.h5", "b.h5"}) {
    const auto out = test::H5Reader(at(f)).lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    ASSERT_GT(out.size(), 2u);
    for (size_t i = 0; i < out.size(); ++i) {
      all += static_cast<int64_t>(out[i].size());
      if (std::string(f) == "b.h5" || i >= 2) want += static_cast<int64_t>(out[i].size());
    }
  }
  ASSERT_LT(want, all);
  EXPECT_EQ(test::H5Reader(at("rm.h5")).scalar_attr<int64_t>("ranks_output_tokens", H5T_NATIVE_INT64), want);
  Proc p = sh(bin() + " report " + at("rm.h5") + " --json");
  ASSERT_EQ(p.code, 0) << p.out;
  const auto j = nlohmann::json::parse(p.out.substr(p.out.find('{')));
  EXPECT_EQ(j["requests"]["output_tokens"].get<int64_t>(), all);
  EXPECT_EQ(j["comm"]["session_output_tokens"].get<int64_t>(), want);
  Proc text = sh(bin() + " report " + at("rm.h5"));
  EXPECT_NE(text.out.find("comm (bytes sent per output token, of each input's last session)"), std::string::npos)
      << text.out;
}

TEST_F(Merge, RefusesAnIdFoundInTwoInputsAndLeavesNoFile) {
  Proc p = merge(at("dup.h5") + " " + at("full.h5") + " " + at("a.h5"));
  EXPECT_NE(p.code, 0);
  const std::string first_id = test::H5Reader(at("a.h5")).strings("/requests/id").at(0);
  EXPECT_NE(p.out.find("request id '" + first_id + "' is in " + at("full.h5")), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("every id must come from exactly one input"), std::string::npos) << p.out;
  EXPECT_FALSE(fs::exists(at("dup.h5")));
  for (const auto& e : fs::directory_iterator(*dir_)) EXPECT_EQ(e.path().string().find("merging"), std::string::npos) << e.path();
  // The same file twice is the same mistake.
  EXPECT_NE(merge(at("dup.h5") + " " + at("a.h5") + " " + at("a.h5")).code, 0);
}

// Shards of runs with other output-deciding settings (b's seed changed here) are not one run:
// merge refuses, naming the setting and both files.
TEST_F(Merge, RefusesShardsOfOtherSettings) {
  fs::copy_file(at("b.h5"), at("b-seed.h5"), fs::copy_options::overwrite_existing);
  std::string config = test::H5Reader(at("b.h5")).string_attr("config");
  const size_t at_seed = config.find("\nseed = ");
  ASSERT_NE(at_seed, std::string::npos) << config;
  const size_t end = config.find('\n', at_seed + 1);
  config.replace(at_seed, end - at_seed, "\nseed = 99");
  {
    ResultWriter w(at("b-seed.h5"), 64, /*resume=*/true);
    w.set_attr("config", config);
  }
  Proc p = merge(at("mixed.h5") + " " + at("a.h5") + " " + at("b-seed.h5"));
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find(at("a.h5") + " and " + at("b-seed.h5") + " were made with other settings"), std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("seed = "), std::string::npos) << p.out;
  EXPECT_NE(p.out.find(" vs 99"), std::string::npos) << p.out;
  EXPECT_FALSE(fs::exists(at("mixed.h5")));
}

// A shard whose prompts repeat an id holds the run's duplicate-id error row beside the first: merge
// copies both as the run wrote them, and still refuses the id in another input.
TEST_F(Merge, KeepsARunsDuplicateIdRowsAndRefusesTheIdElsewhere) {
  test::write_file(*dir_ / "rep.jsonl",
                   "{\"id\": \"r1\", \"prompt\": \"Once\", \"max_tokens\": 3}\n"
                   "{\"id\": \"r2\", \"prompt\": \"Twice\", \"max_tokens\": 3}\n"
                   "{\"id\": \"r1\", \"prompt\": \"Again\", \"max_tokens\": 3}\n");
  test::write_file(*dir_ / "other.jsonl", "\n\n\n{\"id\": \"r3\", \"prompt\": \"Four\", \"max_tokens\": 3}\n");
  run(at("rep.jsonl"), "rep.h5");
  run(at("other.jsonl"), "other.h5");
  Proc p = merge(at("rep-merged.h5") + " " + at("rep.h5") + " " + at("other.h5"));
  ASSERT_EQ(p.code, 0) << p.out;
  test::H5Reader h(at("rep-merged.h5"));
  EXPECT_EQ(h.strings("/requests/id").size(), 4u);
  const std::vector<std::string> errors = h.strings("/requests/error");
  EXPECT_EQ(std::count(errors.begin(), errors.end(),
                       "line 3: duplicate id 'r1' (another request of the file has it; the first to finish is kept)"),
            1);
  EXPECT_NE(merge(at("rep-twice.h5") + " " + at("rep.h5") + " " + at("rep.h5")).code, 0);
}

// Shards of equal size hold the same rows_committed: the merged file commits all of its rows, so
// the report and a --resume read every one of them.
TEST_F(Merge, EqualShardsAreReadWhole) {
  std::string c, d = "\n\n\n";
  for (int i = 0; i < 3; ++i) {
    c += "{\"id\": \"c" + std::to_string(i) + "\", \"prompt\": \"Once\", \"max_tokens\": 3}\n";
    d += "{\"id\": \"d" + std::to_string(i) + "\", \"prompt\": \"Twice\", \"max_tokens\": 3}\n";
  }
  test::write_file(*dir_ / "c.jsonl", c);
  test::write_file(*dir_ / "d.jsonl", d);
  run(at("c.jsonl"), "c.h5");
  run(at("d.jsonl"), "d.h5");
  ASSERT_EQ(test::H5Reader(at("c.h5")).scalar_attr<int64_t>("rows_committed", H5T_NATIVE_INT64),
            test::H5Reader(at("d.h5")).scalar_attr<int64_t>("rows_committed", H5T_NATIVE_INT64));
  Proc p = merge(at("cd.h5") + " " + at("c.h5") + " " + at("d.h5"));
  ASSERT_EQ(p.code, 0) << p.out;
  {
    test::H5Reader h(at("cd.h5"));
    EXPECT_EQ(h.scalar_attr<int64_t>("rows_committed", H5T_NATIVE_INT64), 6);
    EXPECT_EQ(h.scalar_attr<int64_t>("steps_committed", H5T_NATIVE_INT64),
              static_cast<int64_t>(h.rows("/steps/wall_s")));
  }
  Proc r = sh(bin() + " report " + at("cd.h5") + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out.substr(r.out.find('{')))["requests"]["total"].get<int64_t>(), 6);
  // A resume of the merged file keeps its rows and runs nothing.
  test::write_file(*dir_ / "cd.jsonl", c + d.substr(3));
  run(at("cd.jsonl"), "cd.h5", 1, "--resume");
  EXPECT_EQ(read_rows(at("cd.h5")).size(), 6u);
}

TEST_F(Merge, RefusesToWriteOverAnInput) {
  fs::copy_file(at("a.h5"), at("self.h5"), fs::copy_options::overwrite_existing);
  Proc p = merge(at("self.h5") + " " + at("self.h5") + " " + at("b.h5"));
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("is also an input"), std::string::npos) << p.out;
  EXPECT_EQ(read_rows(at("self.h5")), read_rows(at("a.h5")));
}

TEST_F(Merge, NamedOptionsAndMissingInputs) {
  EXPECT_EQ(merge("--out " + at("n.h5") + " --in " + at("a.h5") + " --in " + at("b.h5")).code, 0);
  EXPECT_EQ(read_rows(at("n.h5")), read_rows(at("full.h5")));
  Proc p = merge(at("x.h5") + " " + at("a.h5") + " " + at("nonexistent.h5"));
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("nonexistent.h5"), std::string::npos) << p.out;
  EXPECT_NE(merge(at("x.h5")).code, 0);  // no input
}

// slurm/split_prompts.py, as slurm/array.sh runs it: 3 shards of the JSONL file, and of the plain
// text file (converted to JSONL lines carrying the ids the text reader gives): merged, one run.
TEST_F(Merge, SplitScriptShardsMergedEqualOneRun) {
  if (sh("python3 --version").code != 0) GTEST_SKIP() << "python3 is absent";
  for (const std::string prompts : {"inputs/prompts.jsonl", "inputs/prompts.txt"}) {
    SCOPED_TRACE(prompts);
    const std::string stem = fs::path(prompts).extension() == ".txt" ? "txt" : "jsonl";
    const fs::path shards = *dir_ / ("shards-" + stem);
    Proc split = sh("python3 " + src("slurm/split_prompts.py") + " " + src(prompts) + " " + shards.string() + " 3");
    ASSERT_EQ(split.code, 0) << split.out;
    EXPECT_TRUE(split.out.ends_with("\n3\n")) << split.out;  // the shard count, last on stdout
    std::string ins;
    for (int k = 0; k < 3; ++k) {
      const std::string out = stem + "-shard" + std::to_string(k) + ".h5";
      run((shards / ("shard-00" + std::to_string(k) + ".jsonl")).string(), out);
      ins.append(" ").append(at(out));
    }
    run(src(prompts), stem + "-whole.h5");
    ASSERT_EQ(merge(at(stem + "-merged.h5") + ins).code, 0);
    EXPECT_EQ(read_rows(at(stem + "-merged.h5")), read_rows(at(stem + "-whole.h5")));
  }
  // A JSONL file whose name does not say so: split as the run's --format says (array.sh passes
  // it), not as the name would suggest; the shards run as JSONL and merge into the whole run.
  fs::copy_file(src("inputs/prompts.jsonl"), *dir_ / "eval.ndjson", fs::copy_options::overwrite_existing);
  const fs::path shards = *dir_ / "shards-ndjson";
  Proc split =
      sh("python3 " + src("slurm/split_prompts.py") + " " + at("eval.ndjson") + " " + shards.string() + " 2 jsonl");
  ASSERT_EQ(split.code, 0) << split.out;
  std::string ins;
  for (int k = 0; k < 2; ++k) {
    const std::string out = "ndjson-shard" + std::to_string(k) + ".h5";
    run((shards / ("shard-00" + std::to_string(k) + ".jsonl")).string(), out, 1, "--format jsonl");
    ins.append(" ").append(at(out));
  }
  run(at("eval.ndjson"), "ndjson-whole.h5", 1, "--format jsonl");
  ASSERT_EQ(merge(at("ndjson-merged.h5") + ins).code, 0);
  EXPECT_EQ(read_rows(at("ndjson-merged.h5")), read_rows(at("ndjson-whole.h5")));
  EXPECT_NE(
      sh("python3 " + src("slurm/split_prompts.py") + " " + at("eval.ndjson") + " " + shards.string() + " 2 yaml").code,
      0);
}

}  // namespace
}  // namespace shardlm
