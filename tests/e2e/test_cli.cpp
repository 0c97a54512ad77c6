// The shardlm binary end to end: run -> HDF5, bad input lines, bad checkpoints, tokenize, job files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/shared_data.h"
#include "common/test_files.h"
#include "cli/unused_tensors.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::Proc;
using test::sh;

std::string bin() { return test::shardlm_bin(); }

fs::path tmpdir(const std::string& name) { return test::fresh_dir("cli-" + name); }


TEST(Cli, RunWritesEveryRequestAndPerLineErrors) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("run");
  test::write_file(d / "p.jsonl",
        "{\"id\": \"bos\", \"prompt_token_ids\": [1], \"max_tokens\": 200}\n"
        "{\"id\": \"broken\", \"prompt\": \n"
        "{\"id\": \"typed\", \"prompt\": \"Once\", \"temperature\": \"hot\"}\n"
        "{\"id\": \"utf8\", \"prompt\": \"bad \xff\xfe bytes\"}\n"
        "{\"id\": \"text\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n");
  Proc p = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
              (d / "o.h5").string() + " -q");
  ASSERT_EQ(p.code, 0) << p.out;
  test::H5Reader h(d / "o.h5");
  ASSERT_TRUE(h.ok());
  auto ids = h.strings("/requests/id");
  auto errors = h.strings("/requests/error");
  auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
  auto prompts = h.lists<int32_t>("/requests/prompt_tokens", H5T_NATIVE_INT32);
  ASSERT_EQ(ids.size(), 5u);
  std::map<std::string, size_t> row;
  for (size_t i = 0; i < ids.size(); ++i) row[ids[i]] = i;
  ASSERT_EQ(row.size(), 5u) << "ids: the broken line's row has none";
  EXPECT_EQ(row.count(""), 1u);
  EXPECT_EQ(outs[row["bos"]], test::read_ids(model + "/expected_greedy_from_bos.ids"));
  EXPECT_TRUE(errors[row["bos"]].empty());
  EXPECT_EQ(prompts[row["text"]], (std::vector<int32_t>{1, 403, 407, 261, 378}));
  // The summary's prompt tokens are those the model ran: "bos" and "text", not the error rows'.
  EXPECT_EQ(h.scalar_attr<int64_t>("prompt_tokens", H5T_NATIVE_INT64), 6);
  EXPECT_EQ(h.scalar_attr<int64_t>("request_errors", H5T_NATIVE_INT64), 3);
  EXPECT_EQ(outs[row["text"]].size(), 8u);
  EXPECT_FALSE(errors[row["typed"]].empty());
  EXPECT_NE(errors[row["typed"]].find("temperature"), std::string::npos) << errors[row["typed"]];
  EXPECT_NE(errors[row["utf8"]].find("UTF-8"), std::string::npos) << errors[row["utf8"]];
  bool broken_found = false;
  for (const auto& [id, r] : row) broken_found |= (!errors[r].empty() && id != "typed" && id != "utf8");
  EXPECT_TRUE(broken_found);
  auto reasons = h.strings("/requests/finish_reason");
  EXPECT_EQ(reasons[row["bos"]], "length");
  EXPECT_EQ(reasons[row["typed"]], "error");
  EXPECT_FALSE(h.string_attr("model_config_hash").empty());
  EXPECT_NE(h.string_attr("summary").find("5 requests (3 errors)"), std::string::npos) << h.string_attr("summary");
  EXPECT_NE(h.string_attr("config").find("max-new-tokens = 128"), std::string::npos);
  EXPECT_GT(h.rows("/steps/wall_s"), 0u);
}

// Three replicas take windows of 16 prompt lines from the shared queue; the writer rank gathers
// them into one file whose rows equal a single-rank run's, token for token, also at temperature > 0.
// Ten windows for three replicas, so that each gets work even when one starts late (rank 0 also
// opens the output file first: with three windows it was once left none). Returns the replica
// column by request id. `env` goes before the launcher.
std::map<std::string, int32_t> check_replicas(const std::string& model, const std::string& tag, const std::string& env,
                                              std::string* log) {
  fs::path d = tmpdir(tag);
  std::string lines;
  const char* starts[] = {"Once upon a time", "The dog", "Lily saw a", "One day"};
  for (int i = 0; i < 160; ++i) {
    lines += "{\"id\": \"r" + std::to_string(i) + "\", \"prompt\": \"" + starts[i % 4] +
             "\", \"max_tokens\": " + std::to_string(8 + i % 40) + ", \"temperature\": 0.8}\n";
  }
  test::write_file(d / "p.jsonl", lines);
  const std::string args =
      " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --threads 1 -q --seed 9 --max-seqs 4";
  Proc one = sh(bin() + args + " --out " + (d / "one.h5").string());
  EXPECT_EQ(one.code, 0) << one.out;
  Proc three = sh(env + test::mpirun(3) + bin() + args + " --out " + (d / "three.h5").string());
  EXPECT_EQ(three.code, 0) << three.out;
  *log = three.out;
  if (one.code != 0 || three.code != 0) return {};
  test::H5Reader a(d / "one.h5"), b(d / "three.h5");
  auto collect = [](test::H5Reader& h) {
    std::map<std::string, std::vector<int32_t>> m;
    auto ids = h.strings("/requests/id");
    auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    for (size_t i = 0; i < ids.size(); ++i) m[ids[i]] = outs[i];
    return m;
  };
  auto ma = collect(a), mb = collect(b);
  EXPECT_EQ(ma.size(), 160u);
  EXPECT_EQ(ma, mb);
  auto replicas = b.scalars<int32_t>("/requests/replica", H5T_NATIVE_INT32);
  EXPECT_EQ(std::set<int32_t>(replicas.begin(), replicas.end()), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(b.string_attr("layout"), "world=3 replicas=3 pp=1 tp=1");
  *log += "\nprompt_line_windows = " + b.string_attr("prompt_line_windows");
  std::map<std::string, int32_t> by_id;
  const auto ids = b.strings("/requests/id");
  for (size_t i = 0; i < ids.size() && i < replicas.size(); ++i) by_id[ids[i]] = replicas[i];
  return by_id;
}

TEST(Cli, ReplicasGiveTheSingleRankResult) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  std::string log;
  check_replicas(model, "replicas", "", &log);
  EXPECT_NE(log.find("prompt_line_windows = on-demand"), std::string::npos) << log;
  EXPECT_EQ(log.find("one-sided window"), std::string::npos) << log;
}

// An MPI that cannot create the queue's one-sided window (here Open MPI left with its shared-memory
// component alone, which only exposes memory it allocates itself; on a one-GPU host the staged Open
// MPI answered MPI_ERR_WIN the same way): the job warns and the replicas take the windows in turn,
// replica g windows g, g + 3, ..., with the single-rank result.
TEST(Cli, ReplicasTakeWindowsInTurnWithoutOneSidedMpi) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  std::string log;
  const auto replica = check_replicas(model, "replicas-in-turn", "OMPI_MCA_osc=sm ", &log);
  EXPECT_NE(log.find("warning: MPI cannot create the one-sided window of the prompt-line queue (MPI_ERR_WIN"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("prompt_line_windows = round-robin"), std::string::npos) << log;
  ASSERT_EQ(replica.size(), 160u) << log;
  for (int i = 0; i < 160; ++i) EXPECT_EQ(replica.at("r" + std::to_string(i)), (i / 16) % 3) << "line " << i + 1;
}

// Runs `prompts` (JSONL) through the model quietly; the rows' ids, errors and output tokens.
struct Rows {
  std::vector<std::string> ids, errors;
  std::vector<std::vector<int32_t>> outs;
};
Rows run_rows(const std::string& model, const fs::path& d, const std::string& prompts) {
  test::write_file(d / "p.jsonl", prompts);
  Proc p = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
              (d / "o.h5").string() + " -q");
  EXPECT_EQ(p.code, 0) << p.out;
  if (p.code != 0) return {};
  test::H5Reader h(d / "o.h5");
  return {h.strings("/requests/id"), h.strings("/requests/error"),
          h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32)};
}

TEST(Cli, DuplicateIdsBecomeErrorRows) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  const auto [ids, errors, outs] = run_rows(model, tmpdir("dup"),
                                            "{\"id\": \"a\", \"prompt\": \"Once\", \"max_tokens\": 3}\n"
                                            "{\"id\": \"b\", \"prompt\": \"Once\", \"max_tokens\": 3}\n"
                                            "{\"id\": \"a\", \"prompt\": \"The dog\", \"max_tokens\": 3}\n");
  ASSERT_EQ(ids.size(), 3u);
  int with_output = 0, duplicates = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == "a" && !outs[i].empty()) ++with_output;
    if (errors[i].find("duplicate id 'a'") != std::string::npos) {
      ++duplicates;
      EXPECT_TRUE(outs[i].empty());
    }
  }
  EXPECT_EQ(with_output, 1);
  EXPECT_EQ(duplicates, 1);
}

// A tokenizer whose added token lies past the model's embedding rows (id 512 of a 512-row
// stories260K): a prompt that uses it becomes an error row naming the id; the others complete.
TEST(Cli, TokenizerIdsPastTheVocabularyBecomeErrorRows) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("vocab");
  const fs::path m = d / "model";
  fs::create_directories(m);
  for (const auto& e : fs::directory_iterator(model)) fs::copy(e.path(), m / e.path().filename());
  std::string tok = test::read_file((m / "tokenizer.json").string());
  const std::string key = "\"added_tokens\": [";
  const size_t at = tok.find(key);
  ASSERT_NE(at, std::string::npos);
  tok.insert(at + key.size(),
             "{\"id\": 512, \"content\": \"<pad>\", \"single_word\": false, \"lstrip\": false, "
             "\"rstrip\": false, \"normalized\": false, \"special\": true}, ");
  test::write_file(m / "tokenizer.json", tok);
  const auto [ids, errors, outs] =
      run_rows(m.string(), d,
               "{\"id\": \"pad\", \"prompt\": \"Once upon a time<pad>\", \"max_tokens\": 3}\n"
               "{\"id\": \"ok\", \"prompt\": \"Once upon a time\", \"max_tokens\": 3}\n");
  ASSERT_EQ(ids.size(), 2u);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == "pad") {
      EXPECT_EQ(errors[i], "line 1: token id 512 (from the tokenizer) is outside the vocabulary [0, 512)");
    } else {
      EXPECT_EQ(errors[i], "");
      EXPECT_EQ(outs[i].size(), 3u);
    }
  }
}

TEST(Cli, UnwritableOutputFailsBeforeLoading) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("unwritable");
  test::write_file(d / "p.txt", "hello\n");
  const std::string out = (d / "no" / "such" / "dir" / "o.h5").string();
  Proc p = sh(bin() + " run --model " + model + " --prompts " + (d / "p.txt").string() + " --out " + out);
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find(out), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find("[shardlm] model "), std::string::npos) << "failed only after loading: " << p.out;
}

// Sequence and token limits that cannot run fail while the options are read, before any rank loads
// weights: no sequence, no token, or fewer sequences than pipeline micro-batches.
TEST(Cli, SequenceLimitsThatCannotRunAreRefused) {
  fs::path d = tmpdir("limits");
  test::write_file(d / "p.txt", "hello\n");
  const std::string common = bin() + " run --model " + (d / "no-model").string() + " --prompts " +
                             (d / "p.txt").string() + " --out " + (d / "o.h5").string();
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--max-seqs 0", "--max-seqs must be >= 1, not 0"},
           {"--max-seqs -3", "--max-seqs must be >= 1, not -3"},
           {"--max-batch-tokens 0", "--max-batch-tokens must be >= 1, not 0"},
           {"--pp 2 --max-seqs 1", "--max-seqs 1 is below --pp 2"}}) {
    Proc p = sh(common + " " + flags);
    EXPECT_NE(p.code, 0) << flags;
    EXPECT_NE(p.out.find(message), std::string::npos) << flags << "\n" << p.out;
  }
}

// --max-model-len: kept and recorded; more than the model's context fails before any weight is
// read; more than the KV cache holds fails at start; a --resume keeps it, or is refused where another
// is asked for. Without it the smallest cache of the job sets the limit, said at start and recorded,
// and a resume on another cache warns that its limit differs.
TEST(Cli, MaxModelLenIsRecordedAndResumeKeepsIt) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("max-model-len");
  std::string long_ids;
  for (int i = 0; i < 100; ++i) long_ids += (i ? "," : "") + std::string("5");
  const std::string story = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 300, \"ignore_eos\": true";
  test::write_file(d / "p.jsonl", "{\"id\": \"a\", " + story.substr(1) +
                                      "}\n{\"id\": \"long\", \"prompt_token_ids\": [" + long_ids +
                                      "], \"max_tokens\": 5}\n");
  const std::string run = bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out ";
  auto config_has = [](const test::H5Reader& h, const std::string& line) {
    return h.string_attr("config").find("\n" + line + "\n") != std::string::npos;
  };
  {
    Proc p = sh(run + (d / "asked.h5").string() + " --max-model-len 64");
    ASSERT_EQ(p.code, 0) << p.out;
    EXPECT_NE(p.out.find("context limit 64 tokens"), std::string::npos) << p.out;
    test::H5Reader h(d / "asked.h5");
    EXPECT_EQ(h.scalar_attr<int64_t>("max_model_len", H5T_NATIVE_INT64), 64);
    EXPECT_TRUE(config_has(h, "max-model-len = 64")) << h.string_attr("config");
    const auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    const auto ids = h.strings("/requests/id");
    const auto errors = h.strings("/requests/error");
    ASSERT_EQ(ids.size(), 2u);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == "a") {
        EXPECT_EQ(outs[i].size(), 64u - 5u);  // BOS and 4 prompt tokens
      } else {
        EXPECT_NE(errors[i].find("within the context of 64 tokens (--max-model-len"), std::string::npos) << errors[i];
      }
    }
  }
  {
    Proc p = sh(run + (d / "over.h5").string() + " --max-model-len 1000");
    EXPECT_NE(p.code, 0);
    EXPECT_NE(
        p.out.find("--max-model-len 1000 is more than the context of " + model + " (max_position_embeddings 512)"),
        std::string::npos)
        << p.out;
    EXPECT_EQ(p.out.find("[shardlm] model "), std::string::npos) << "failed only after loading: " << p.out;
  }
  // 0.0001 GiB hold 5 blocks of 16 tokens of stories260K's cache.
  const std::string tiny_cache = " --kv-cache-gb 0.0001";
  {
    Proc p = sh(run + (d / "cache.h5").string() + tiny_cache + " --max-model-len 300");
    EXPECT_NE(p.code, 0);
    EXPECT_NE(p.out.find("--max-model-len 300: the smallest KV cache of the job holds 80 tokens"), std::string::npos)
        << p.out;
  }
  Proc p = sh(run + (d / "auto.h5").string() + tiny_cache);
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("context limit: 80 tokens, what the smallest KV cache of the job holds (the model's context is "
                       "512)"),
            std::string::npos)
      << p.out;
  {
    test::H5Reader h(d / "auto.h5");
    EXPECT_EQ(h.scalar_attr<int64_t>("max_model_len", H5T_NATIVE_INT64), 80);
    EXPECT_TRUE(config_has(h, "max-model-len = 0")) << "not asked for: " << h.string_attr("config");
  }
  test::write_file(d / "p.jsonl",
                   test::read_file((d / "p.jsonl").string()) + "{\"id\": \"b\", " + story.substr(1) + "}\n");
  auto outputs = [](const fs::path& file) {
    test::H5Reader h(file);
    const auto ids = h.strings("/requests/id");
    const auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    std::map<std::string, size_t> n;
    for (size_t i = 0; i < ids.size(); ++i) n[ids[i]] = outs[i].size();
    return n;
  };
  // A limit asked for is kept by a resume that asks for none (b stops at 64 too), and refused
  // against another one asked for.
  fs::copy_file(d / "asked.h5", d / "refused.h5");
  p = sh(run + (d / "asked.h5").string() + " --resume");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_EQ(outputs(d / "asked.h5"), (std::map<std::string, size_t>{{"a", 59}, {"long", 0}, {"b", 59}}));
  EXPECT_EQ(test::H5Reader(d / "asked.h5").scalar_attr<int64_t>("max_model_len", H5T_NATIVE_INT64), 64);
  p = sh(run + (d / "refused.h5").string() + " --resume --max-model-len 128");
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("max-model-len = 64 vs 128 (the file's vs this run's)"), std::string::npos) << p.out;
  // A limit the cache set is not a setting: a resume on a larger cache runs under its own, and says
  // so (b is not cut at 80).
  p = sh(run + (d / "auto.h5").string() + " --resume");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("warning: --resume: the file's earlier rows were made under a context limit of 80 tokens, "
                       "this session's is 512"),
            std::string::npos)
      << p.out;
  EXPECT_EQ(outputs(d / "auto.h5"), (std::map<std::string, size_t>{{"a", 75}, {"long", 0}, {"b", 300}}));
  EXPECT_EQ(test::H5Reader(d / "auto.h5").scalar_attr<int64_t>("max_model_len", H5T_NATIVE_INT64), 512);
}

// Every rank of a job keeps the limit of the smallest cache: here pipeline stage 0, whose three of the
// five layers leave fewer blocks in the same budget than stage 1's two.
TEST(Cli, ContextLimitIsTheSmallestStagesCache) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("context-pp");
  test::write_file(d / "p.jsonl",
                   "{\"id\": \"a\", \"prompt\": \"Once upon a time\", \"max_tokens\": 300, "
                   "\"ignore_eos\": true}\n");
  Proc p = sh(test::mpirun(2) + bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
              (d / "o.h5").string() + " --pp 2 --max-seqs 2 --kv-cache-gb 0.0001");
  ASSERT_EQ(p.code, 0) << p.out;
  test::H5Reader h(d / "o.h5");
  // 0.0001 GiB over 3 layers x 16 tokens x 64 floats: 8 blocks (stage 1's 2 layers: 13).
  EXPECT_EQ(h.scalar_attr<int64_t>("max_model_len", H5T_NATIVE_INT64), 128);
  EXPECT_EQ(h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32).at(0).size(), 128u - 5u);
}

// Checkpoint tensors the config's model does not read are named at start and counted in the file:
// here a config of 4 layers over stories260K's 5. Pipeline stages each read their own layers, and
// the job counts what none of them read. Layers a config declares as multi-token prediction
// (num_nextn_predict_layers, DeepSeek-V3) are left out by design, without a warning.
TEST(Cli, CheckpointTensorsNoRankReadsAreNamed) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("unused-tensors");
  test::write_file(d / "p.txt", "Once upon a time\n");
  auto run = [&](const std::string& dir, const std::string& launch, const std::string& flags) {
    Proc p = sh(launch + bin() + " run --model " + dir + " --prompts " + (d / "p.txt").string() + " --out " +
                (d / "o.h5").string() + " -q " + flags);
    EXPECT_EQ(p.code, 0) << p.out;
    test::H5Reader h(d / "o.h5");
    std::pair<Proc, int64_t> r{p, h.scalar_attr<int64_t>("checkpoint_tensors_not_read", H5T_NATIVE_INT64)};
    fs::remove(d / "o.h5");
    return r;
  };
  auto [whole, none] = run(model, test::mpirun(2), "--pp 2 --max-seqs 2");
  EXPECT_EQ(none, 0);
  EXPECT_EQ(whole.out.find("warning: "), std::string::npos) << whole.out;

  const fs::path fewer = d / "model";
  fs::create_directory(fewer);
  for (const auto& e : fs::directory_iterator(model)) fs::copy_file(e.path(), fewer / e.path().filename());
  const std::string config = test::read_file((fewer / "config.json").string());
  const size_t at = config.find("\"num_hidden_layers\": 5");
  ASSERT_NE(at, std::string::npos) << config;
  std::string four = config;
  four.replace(at, std::string("\"num_hidden_layers\": 5").size(), "\"num_hidden_layers\": 4");
  fs::permissions(fewer / "config.json", fs::perms::owner_write, fs::perm_options::add);
  test::write_file(fewer / "config.json", four);
  auto [warned, count] = run(fewer.string(), "", "");
  EXPECT_EQ(count, 9);  // layer 4's 2 norms, 4 attention and 3 MLP weights
  EXPECT_NE(warned.out.find("warning: 9 tensors of " + fewer.string()), std::string::npos) << warned.out;
  EXPECT_NE(warned.out.find(": model.layers.* (9 tensors, numbered 4, e.g. model.layers.4.input_layernorm.weight)"),
            std::string::npos)
      << warned.out;

  // A multi-token-prediction layer (its eh_proj and enorm, in a shard of their own: layer 7 here)
  // is left out by design; the config's cut layer 4 is still named.
  const std::vector<float> proj(64 * 128, 0.5f), norm(64, 1.0f);
  write_safetensors((fewer / "mtp.safetensors").string(),
                    {{"model.layers.7.eh_proj.weight", DType::F32, {64, 128}, proj.data()},
                     {"model.layers.7.enorm.weight", DType::F32, {64}, norm.data()}});
  test::write_file(fewer / "model.safetensors.index.json",
                   R"({"weight_map": {"model.embed_tokens.weight": "model.safetensors",)"
                   R"( "model.layers.7.eh_proj.weight": "mtp.safetensors"}})");
  auto [mtp, with_mtp] = run(fewer.string(), "", "");
  EXPECT_EQ(with_mtp, 9);
  EXPECT_NE(mtp.out.find("(9 tensors, numbered 4, e.g."), std::string::npos) << mtp.out;
}

// name_patterns: by the first three components, digits as '*', the largest group first, with the
// range of their first numbers and an example.
TEST(Cli, UnusedTensorNamesAreGroupedByPattern) {
  EXPECT_EQ(name_patterns({"lm_head.weight", "model.layers.4.mlp.experts.64.up_proj.weight",
                           "model.layers.12.mlp.experts.64.up_proj.weight", "model.layers.5.mlp.gate.weight"}),
            "model.layers.* (3 tensors, numbered 4-12, e.g. model.layers.4.mlp.experts.64.up_proj.weight), "
            "lm_head.weight");
  EXPECT_EQ(name_patterns({"a.1", "b.1", "c.1"}, 2), "a.1, b.1, and 1 more groups");
  EXPECT_EQ(name_patterns({}), "");
}

// A line whose id cannot be read has an error row without one (its line number in /requests/line):
// numbered ids are common, and the row must not take the id of the next line, whose output would
// then be dropped as a duplicate and never rerun by --resume.
TEST(Cli, AnUnreadableLineTakesNoOtherRequestsId) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("unreadable-id");
  test::write_file(d / "p.jsonl",
                   "{\"id\": 1, \"prompt\": \"Once\", \"max_tokens\": 4}\n"
                   "{\"id\": 2, \"prompt\": \n"
                   "{\"id\": 2, \"prompt\": \"Twice\", \"max_tokens\": 4}\n"
                   "[3]\n");
  const std::string run = bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
                          (d / "o.h5").string() + " -q";
  auto check = [&] {
    test::H5Reader h(d / "o.h5");
    const auto ids = h.strings("/requests/id");
    const auto lines = h.scalars<int64_t>("/requests/line", H5T_NATIVE_INT64);
    const auto errors = h.strings("/requests/error");
    const auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    ASSERT_EQ(ids.size(), 4u);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (lines[i] == 2 || lines[i] == 4) {
        EXPECT_EQ(ids[i], "") << lines[i];
        EXPECT_NE(errors[i].find(lines[i] == 2 ? "not valid JSON" : "expected a JSON object"), std::string::npos)
            << errors[i];
      } else {
        EXPECT_EQ(errors[i], "") << ids[i];
        EXPECT_EQ(outs[i].size(), 4u) << ids[i];
      }
    }
  };
  Proc p = sh(run);
  ASSERT_EQ(p.code, 0) << p.out;
  check();
  // Every line has its row: a resume runs nothing and adds none.
  p = sh(run + " --resume");
  ASSERT_EQ(p.code, 0) << p.out;
  check();
}

TEST(Cli, MissingWeightsFailAtLoadNamingTheDirectory) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("missing");
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fs::path(model) / f, d / f);
  test::write_file(d / "p.txt", "hello\n");
  Proc p = sh(bin() + " run --model " + d.string() + " --prompts " + (d / "p.txt").string() + " --out " + (d / "o.h5").string());
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("safetensors"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find(d.string()), std::string::npos) << p.out;
}

TEST(Cli, TruncatedCheckpointNamesFileAndTensor) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("trunc");
  for (const auto& e : fs::directory_iterator(model)) fs::copy_file(e.path(), d / e.path().filename());
  fs::permissions(d / "model.safetensors", fs::perms::owner_write, fs::perm_options::add);
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 1000);
  test::write_file(d / "p.txt", "hello\n");
  Proc p = sh(bin() + " run --model " + d.string() + " --prompts " + (d / "p.txt").string() + " --out " + (d / "o.h5").string());
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("model.safetensors"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("model.layers."), std::string::npos) << "names the tensor: " << p.out;
}

TEST(Cli, TokenizeEncodesAndDecodes) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  EXPECT_EQ(sh(bin() + " tokenize --model " + model + " --text 'Once upon a time'").out, "403 407 261 378\n");
  EXPECT_EQ(sh(bin() + " tokenize --model " + model + " --bos --text 'Once upon a time'").out, "1 403 407 261 378\n");
  EXPECT_EQ(sh(bin() + " tokenize --model " + model + " --decode '403 407 261 378'").out, "Once upon a time\n");
  Proc bad = sh(bin() + " tokenize --model " + model + " --decode '403 x'");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("'x' is not a token id"), std::string::npos) << bad.out;
}

TEST(Cli, JobFileWithCommandLineOverride) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("ini");
  test::write_file(d / "p.txt", "Once upon a time\nThe dog\n");
  test::write_file(d / "job.ini", "model = " + model + "\nprompts = " + (d / "p.txt").string() +
                                      "\nout = " + (d / "o.h5").string() +
                                      "\nmax-new-tokens = 3\nquiet = true\nignore-eos = true\n");
  Proc p = sh(bin() + " run --config " + (d / "job.ini").string() + " --max-new-tokens 5");
  ASSERT_EQ(p.code, 0) << p.out;
  test::H5Reader h(d / "o.h5");
  auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].size(), 5u);
  EXPECT_EQ(h.strings("/requests/id"), (std::vector<std::string>{"1", "2"}));
  EXPECT_NE(h.string_attr("config").find("\nignore-eos = true\n"), std::string::npos) << h.string_attr("config");
  // A switch the job file turns on, the command line turns off.
  Proc off = sh(bin() + " run --config " + (d / "job.ini").string() + " --ignore-eos=false --quiet false --out " +
                (d / "off.h5").string());
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_NE(test::H5Reader(d / "off.h5").string_attr("config").find("\nignore-eos = false\n"), std::string::npos);
  EXPECT_NE(off.out.find("KV cache on rank 0"), std::string::npos) << "--quiet false: the start report expected\n"
                                                                   << off.out;
  Proc bad = sh(bin() + " run --config " + (d / "job.ini").string() + " --ignore-eos=maybe");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("ignore-eos"), std::string::npos) << bad.out;
}

// The recorded config reproduces the run as a job file: stop strings are kept JSON-quoted (a
// leading space and '#', a job file's comment, survive), a job file's stop strings are replaced by
// the command line's, not added to, and a seed that is not a 64-bit count is refused.
TEST(Cli, RecordedConfigKeepsStopStringsAndTheCommandLineReplacesThem) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("stop-ini");
  test::write_file(d / "p.txt", "Once upon a time\n");
  const std::string common =
      bin() + " run --model " + model + " --prompts " + (d / "p.txt").string() + " --max-new-tokens 4 -q --out ";
  Proc first = sh(common + (d / "a.h5").string() + " --stop ' the' --stop '#x'");
  ASSERT_EQ(first.code, 0) << first.out;
  const std::string config = test::H5Reader(d / "a.h5").string_attr("config");
  EXPECT_NE(config.find("\nstop = \" the\"\n"), std::string::npos) << config;
  EXPECT_NE(config.find("\nstop = \"\\u0023x\"\n"), std::string::npos) << config;
  // The recorded config as a job file (another --out) gives the same options.
  std::string job = config;
  const size_t out_at = job.find("\nout = ");
  job.replace(out_at, job.find('\n', out_at + 1) - out_at, "\nout = " + (d / "b.h5").string());
  test::write_file(d / "job.ini", job);
  Proc again = sh(bin() + " run --config " + (d / "job.ini").string());
  ASSERT_EQ(again.code, 0) << again.out;
  std::string want = config;
  want.replace(out_at, want.find('\n', out_at + 1) - out_at, "\nout = " + (d / "b.h5").string());
  EXPECT_EQ(test::H5Reader(d / "b.h5").string_attr("config"), want);
  Proc replaced = sh(bin() + " run --config " + (d / "job.ini").string() + " --stop Z --out " + (d / "c.h5").string());
  ASSERT_EQ(replaced.code, 0) << replaced.out;
  const std::string c = test::H5Reader(d / "c.h5").string_attr("config");
  EXPECT_NE(c.find("\nstop = \"Z\"\n"), std::string::npos) << c;
  EXPECT_EQ(c.find(" the"), std::string::npos) << c;
  // Numbers are recorded as they read back (a job file and --resume compare them), not to 6 digits.
  Proc precise = sh(common + (d / "e.h5").string() + " --temperature 0.123456789 --top-p 0.99999999");
  ASSERT_EQ(precise.code, 0) << precise.out;
  const std::string e = test::H5Reader(d / "e.h5").string_attr("config");
  EXPECT_NE(e.find("\ntemperature = 0.123456789\n"), std::string::npos) << e;
  EXPECT_NE(e.find("\ntop-p = 0.99999999\n"), std::string::npos) << e;
  Proc bad_seed = sh(common + (d / "d.h5").string() + " --seed -1");
  EXPECT_NE(bad_seed.code, 0);
  EXPECT_NE(bad_seed.out.find("--seed must be an integer from 0 to 2^64-1, not '-1'"), std::string::npos)
      << bad_seed.out;
}

// --kv-dtype: auto resolves from the checkpoint (stories260K is float32) and the resolved dtype is
// recorded; a bf16 cache changes the stored keys and values (every log-probability moves a
// little), yet greedy decoding from BOS still gives the reference's 200 tokens; a bad name fails.
TEST(Cli, KvDtypeIsResolvedRecordedAndUsed) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = tmpdir("kv-dtype");
  test::write_file(d / "p.jsonl", "{\"id\": \"bos\", \"prompt_token_ids\": [1], \"max_tokens\": 200}\n");
  const std::vector<int32_t> reference = test::read_ids(model + "/expected_greedy_from_bos.ids");
  // (--kv-dtype, what it resolves to for this fp32 checkpoint)
  const std::pair<const char*, const char*> cases[] = {{"auto", "fp32"}, {"bf16", "bf16"}, {"fp8_e4m3", "fp8"}};
  std::vector<std::vector<float>> logprobs;
  for (const auto& [dtype, resolved] : cases) {
    const fs::path out = d / (std::string(dtype) + ".h5");
    Proc p = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " + out.string() +
                " --kv-dtype " + dtype);
    ASSERT_EQ(p.code, 0) << p.out;
    EXPECT_NE(p.out.find(std::string("KV cache ") + resolved), std::string::npos) << p.out;
    test::H5Reader h(out);
    ASSERT_TRUE(h.ok());
    EXPECT_NE(h.string_attr("config").find(std::string("kv-dtype = ") + resolved), std::string::npos)
        << h.string_attr("config");
    auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    ASSERT_EQ(outs.size(), 1u);
    if (std::string(resolved) == "fp8") {
      // e4m3 keeps 3 mantissa bits: greedy decoding leaves the reference after a while (measured:
      // at token 106 of 200, log-probabilities up to 0.32 away before that).
      ASSERT_EQ(outs[0].size(), reference.size());
      EXPECT_TRUE(std::equal(reference.begin(), reference.begin() + 50, outs[0].begin())) << dtype;
    } else {
      EXPECT_EQ(outs[0], reference) << dtype;
    }
    logprobs.push_back(h.lists<float>("/requests/token_logprobs", H5T_NATIVE_FLOAT).at(0));
  }
  for (size_t c = 1; c < logprobs.size(); ++c) {
    ASSERT_EQ(logprobs[0].size(), logprobs[c].size());
    size_t moved = 0;
    float most = 0;
    for (size_t i = 0; i < 50; ++i) {
      moved += logprobs[0][i] != logprobs[c][i];
      most = std::max(most, std::abs(logprobs[0][i] - logprobs[c][i]));
    }
    EXPECT_GT(moved, 25u) << "the " << cases[c].second << " cache left the log-probabilities as they were";
    EXPECT_LT(most, c == 1 ? 0.1f : 0.5f) << cases[c].second;
  }
  Proc bad = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
                (d / "bad.h5").string() + " --kv-dtype fp16");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--kv-dtype must be auto, fp32, bf16 or fp8, not 'fp16'"), std::string::npos) << bad.out;
  Proc bad_prefill = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
                        (d / "bad.h5").string() + " --fp8-prefill fp4");
  EXPECT_NE(bad_prefill.code, 0);
  EXPECT_NE(bad_prefill.out.find("--fp8-prefill must be w8a8 or bf16, not 'fp4'"), std::string::npos)
      << bad_prefill.out;
  Proc bad_attention = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
                          (d / "bad.h5").string() + " --prefill-attention fp16");
  EXPECT_NE(bad_attention.code, 0);
  EXPECT_NE(bad_attention.out.find("--prefill-attention must be auto, bf16 or fp32, not 'fp16'"), std::string::npos)
      << bad_attention.out;
  Proc bad_decode = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
                       (d / "bad.h5").string() + " --decode-attention auto");
  EXPECT_NE(bad_decode.code, 0);
  EXPECT_NE(bad_decode.out.find("--decode-attention must be fp32 or bf16, not 'auto'"), std::string::npos)
      << bad_decode.out;
  Proc bad_experts = sh(bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " --out " +
                        (d / "bad.h5").string() + " --fp8-expert-gemm batched");
  EXPECT_NE(bad_experts.code, 0);
  EXPECT_NE(bad_experts.out.find("--fp8-expert-gemm must be grouped or per-expert, not 'batched'"), std::string::npos)
      << bad_experts.out;
}

TEST(Cli, HelpListsOptionsWithDefaults) {
  Proc p = sh(bin() + " run --help");
  EXPECT_EQ(p.code, 0);
  for (const char* opt : {"--model",
                          "--prompts",
                          "--out",
                          "--max-new-tokens arg (=128)",
                          "--temperature arg (=0)",
                          "--top-p",
                          "--top-k",
                          "--min-p",
                          "--repetition-penalty arg (=1)",
                          "--frequency-penalty arg (=0)",
                          "--presence-penalty arg (=0)",
                          "--seed",
                          "--max-batch-tokens",
                          "--max-seqs",
                          "--kv-cache-gb",
                          "--kv-dtype arg (=auto)",
                          "--fp8-prefill arg (=w8a8)",
                          "--prefill-attention arg (=auto)",
                          "--decode-attention arg (=fp32)",
                          "--config"}) {
    EXPECT_NE(p.out.find(opt), std::string::npos) << opt;
  }
  Proc bad = sh(bin() + " run --model x --prompts y --out z --temperature warm");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("temperature"), std::string::npos) << bad.out;
  // vLLM's bounds hold for the run's defaults too, before anything loads.
  for (const auto& [flag, want] : std::vector<std::pair<std::string, std::string>>{
           {"--temperature 3", "temperature must be in [0, 2]"},
           {"--repetition-penalty 0", "repetition_penalty must be finite and > 0"},
           {"--presence-penalty -2.5", "presence_penalty must be in [-2, 2]"}}) {
    Proc out_of_bounds = sh(bin() + " run --model x --prompts y --out z " + flag);
    EXPECT_NE(out_of_bounds.code, 0) << flag;
    EXPECT_NE(out_of_bounds.out.find("shardlm run: the sampling options: " + want), std::string::npos)
        << flag << "\n"
        << out_of_bounds.out;
  }
}

}  // namespace
}  // namespace shardlm
