// Every sharded layout gives the single-rank result: the same tokens, and log-probabilities of the
// chosen tokens within a stated tolerance (tensor parallelism sums partial products in another
// order, so logits differ in the last bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <csignal>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/layout_check.h"
#include "common/shared_data.h"
#include "common/test_files.h"
#include "common/tiny_model.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::mpirun;
using test::Proc;
using test::sh;
using test::shardlm_bin;

struct Layout {
  int tp, pp, replicas;
};

std::string name(const Layout& l) {
  return "tp" + std::to_string(l.tp) + "_pp" + std::to_string(l.pp) + "_r" + std::to_string(l.replicas);
}

void check_layouts(const std::string& model, const std::vector<Layout>& layouts, bool long_prompts,
                   const std::string& tag, const std::string& extra = "") {
  std::vector<test::LayoutRun> runs;
  for (const Layout& l : layouts) {
    runs.push_back({l.tp * l.pp * l.replicas,
                    "--tp " + std::to_string(l.tp) + " --pp " + std::to_string(l.pp) + extra});
  }
  test::check_layout_runs(model, runs, long_prompts, tag);
}

TEST(Layouts, Stories260KEveryLayoutMatchesOneRank) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  check_layouts(model, {{2, 1, 1}, {4, 1, 1}, {1, 2, 1}, {1, 3, 1}, {2, 2, 1}, {1, 1, 2}, {2, 2, 2}}, false, "stories");
}

// A bf16 KV cache (stories260K is an fp32 checkpoint, whose cache is fp32 by default): every layout
// gives the single rank's bf16-cache result.
TEST(Layouts, Bf16KvCacheMatchesOneRank) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  std::vector<test::LayoutRun> runs{{2, "--tp 2"}, {2, "--pp 2"}, {4, "--tp 2 --pp 2"}};
  test::check_layout_runs(model, runs, true, "bf16-cache", " --kv-dtype bf16");
}

// An fp8 KV cache, likewise.
TEST(Layouts, Fp8KvCacheMatchesOneRank) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  std::vector<test::LayoutRun> runs{{2, "--tp 2"}, {2, "--pp 2"}, {4, "--tp 2 --pp 2"}};
  test::check_layout_runs(model, runs, true, "fp8-cache", " --kv-dtype fp8");
}

// Random models made here: KV heads fewer than tp (replicated), q/k/v bias with tied embeddings,
// QK-norm with head_dim != hidden/heads, and a sliding window shorter than the prompts.
// Unbalanced stages given by hand: one layer on the first stage, four on the second.
TEST(Layouts, StageLayersByHand) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  check_layouts(model, {{1, 2, 1}, {2, 2, 1}}, false, "pp-layers", " --pp-layers 1,4");
}

// With pp the leader runs a micro-batch per stage, each with its share of --max-seqs: together
// they hold at most --max-seqs sequences (3 over 2 micro-batches is 2 + 1, not 2 + 2), which the
// KV block cap is sized for.
TEST(Layouts, MicroBatchesShareMaxSeqs) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  const fs::path d = test::fresh_dir("micro-batch-seqs");
  std::string lines;
  for (int i = 0; i < 8; ++i)
    lines += "{\"id\": \"s" + std::to_string(i) + "\", \"prompt_token_ids\": [1, " + std::to_string(400 + i) +
             "], \"max_tokens\": 24, \"ignore_eos\": true}\n";
  test::write_file(d / "p.jsonl", lines);
  const std::string out = (d / "o.h5").string();
  Proc p = sh(mpirun(2) + shardlm_bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
              " --pp 2 --max-seqs 3 --threads 1 -q --out " + out);
  ASSERT_EQ(p.code, 0) << p.out;
  const std::vector<int32_t> running = test::H5Reader(out).scalars<int32_t>("/steps/running", H5T_NATIVE_INT32);
  ASSERT_FALSE(running.empty());
  EXPECT_EQ(*std::max_element(running.begin(), running.end()), 3);
}

TEST(Layouts, RandomModelsOfEachArchitecture) {
  fs::path d = test::fresh_dir("layout-models");
  struct Case {
    const char* config;
    std::vector<Layout> layouts;
  };
  const Case cases[] = {
      {"tiny-llama", {{4, 1, 1}, {2, 2, 1}}},
      {"tiny-qwen2", {{2, 2, 1}}},
      {"tiny-qwen3", {{2, 1, 1}, {1, 2, 1}}},
      {"tiny-mistral", {{2, 2, 1}}},
  };
  for (const Case& c : cases) {
    const std::string dir = (d / c.config).string();
    Proc made = sh(shardlm_bin() + " make-model --config " + std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" +
                   c.config + ".json --out " + dir + " --dtype bf16 --seed 11");
    ASSERT_EQ(made.code, 0) << made.out;
    check_layouts(dir, c.layouts, true, c.config);
  }
}

// --op-profile on tp and pp layouts: the tokens stay the single-rank ones, and /op_profile holds
// every rank's part of its steps: each of a rank's layers once a step, tp's all-reduces (the
// embedding's and two a layer) on both tp ranks, the head and the sampling on the last stage only.
TEST(Layouts, OpProfileOfEveryRank) {
  fs::path d = test::fresh_dir("layout-op-profile");
  const std::string model = (d / "m").string();
  Proc made = sh(shardlm_bin() + " make-model --config " + std::string(SHARDLM_SOURCE_DIR) +
                 "/inputs/models/tiny-llama.json --out " + model + " --seed 11");
  ASSERT_EQ(made.code, 0) << made.out;
  const std::vector<std::string> outs =
      test::check_layout_runs(model, {{2, "--tp 2 --op-profile"}, {2, "--pp 2 --op-profile"}}, false, "op-profile");
  ASSERT_EQ(outs.size(), 2u);
  struct Want {
    int rank;
    std::map<std::string, int64_t> calls_per_step;  // 0: absent
  };
  const int64_t L = 4;  // tiny-llama
  const std::vector<std::vector<Want>> layouts = {
      {{0, {{"attn core", L}, {"tp all-reduce", 2 * L + 1}, {"lm head", 1}, {"sampling", 1}}},
       {1, {{"attn core", L}, {"tp all-reduce", 2 * L + 1}, {"lm head", 1}, {"sampling", 0}}}},
      {{0, {{"attn core", L / 2}, {"embedding", 1}, {"lm head", 0}, {"sampling", 0}, {"tp all-reduce", 0}}},
       {1, {{"attn core", L / 2}, {"embedding", 0}, {"lm head", 1}, {"sampling", 1}}}}};
  for (size_t l = 0; l < outs.size(); ++l) {
    test::H5Reader f(outs[l]);
    ASSERT_TRUE(f.ok()) << outs[l];
    const auto rank = f.scalars<int32_t>("op_profile/rank", H5T_NATIVE_INT32);
    const auto kind = f.strings("op_profile/kind");
    const auto section = f.strings("op_profile/section");
    const auto steps = f.scalars<int64_t>("op_profile/steps", H5T_NATIVE_INT64);
    const auto calls = f.scalars<int64_t>("op_profile/calls", H5T_NATIVE_INT64);
    const auto seconds = f.scalars<double>("op_profile/seconds", H5T_NATIVE_DOUBLE);
    const auto step_seconds = f.scalars<double>("op_profile/step_seconds", H5T_NATIVE_DOUBLE);
    ASSERT_FALSE(rank.empty()) << outs[l];
    for (const Want& w : layouts[l]) {
      for (const char* k : {"prefill", "decode"}) {
        double sum = 0, step_s = 0;
        int64_t n_steps = 0;
        std::map<std::string, int64_t> seen;
        for (size_t i = 0; i < rank.size(); ++i) {
          if (rank[i] != w.rank || kind[i] != k) continue;
          seen[section[i]] = calls[i];
          n_steps = steps[i];
          step_s = step_seconds[i];
          sum += seconds[i];
          EXPECT_GE(seconds[i], 0) << section[i];
        }
        ASSERT_GT(n_steps, 0) << outs[l] << " rank " << w.rank << " " << k;
        EXPECT_LE(sum, step_s * (1 + 1e-9)) << outs[l] << " rank " << w.rank << " " << k;
        for (const auto& [name, n] : w.calls_per_step) {
          const int64_t got = seen.count(name) ? seen.at(name) : 0;
          EXPECT_EQ(got, n * n_steps) << outs[l] << " rank " << w.rank << " " << k << " " << name;
        }
      }
    }
  }
}

// The tensor- and pipeline-parallel groups on the libfabric communicator (whatever RDM provider
// libfabric lists first here: tcp;ofi_rxm or shm) give the single-rank result too.
TEST(Layouts, FabricCommunicatorMatchesOneRank) {
#ifndef SHARDLM_HAVE_LIBFABRIC
  GTEST_SKIP() << "built without libfabric: no --comm fabric";
#else
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  check_layouts(model, {{2, 1, 1}, {1, 2, 1}, {2, 2, 1}, {4, 1, 1}}, false, "fabric", " --comm fabric");
#endif
}

TEST(Layouts, RefusesLayoutsThatDoNotDivide) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = test::fresh_dir("layout-bad");
  test::write_file(d / "p.txt", "hello\n");
  const std::string args = " run --model " + model + " --prompts " + (d / "p.txt").string() + " --out " +
                           (d / "o.h5").string() + " -q --threads 1";
  Proc three = sh(mpirun(3) + shardlm_bin() + args + " --tp 3");
  EXPECT_NE(three.code, 0);
  EXPECT_NE(three.out.find("--tp 3 does not divide the 8 attention heads"), std::string::npos) << three.out;
  Proc world = sh(mpirun(3) + shardlm_bin() + args + " --tp 2");
  EXPECT_NE(world.code, 0);
  EXPECT_NE(world.out.find("needs 2 ranks but the job has 3"), std::string::npos) << world.out;
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

// World ranks of the shardlm processes whose command line contains `marker`, by pid.
std::map<int, pid_t> ranks_of_job(const std::string& marker) {
  std::map<int, pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (cmdline.find(marker) == std::string::npos || cmdline.find("shardlm") == std::string::npos ||
        cmdline.rfind("mpirun", 0) == 0 || cmdline.find("mpiexec") != std::string::npos ||
        cmdline.find("orterun") != std::string::npos) {
      continue;
    }
    std::ifstream env(e.path() / "environ", std::ios::binary);
    std::string vars((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
    const size_t at = vars.find(key);
    if (at == std::string::npos) continue;
    out[std::atoi(vars.c_str() + at + key.size())] = static_cast<pid_t>(std::atoi(pid.c_str()));
  }
  return out;
}

struct FaultRun {
  test::Proc proc;
  double seconds;
  std::string command;  // the job's command line, without the redirection of its output
  fs::path out;         // its result file
};

// Starts a long tp=2 run, waits until its progress line shows generation under way and both ranks
// are found, sends `sig` to world rank 1, and waits for the job to end.
FaultRun run_with_fault(int sig, const std::string& tag, double comm_timeout, const std::string& extra = "") {
  const std::string model = test::shared_path("models/stories260K");
  fs::path d = test::fresh_dir("fault-" + tag);
  std::string lines;
  for (int i = 0; i < 400; ++i) lines += "{\"id\": \"f" + std::to_string(i) + "\", \"prompt_token_ids\": [1], \"max_tokens\": 300, \"ignore_eos\": true}\n";
  test::write_file(d / "p.jsonl", lines);
  const std::string marker = (d / "fault.h5").string();
  const std::string log = (d / "log").string();
  const std::string job = mpirun(2) + shardlm_bin() + " run --model " + model + " --prompts " +
                          (d / "p.jsonl").string() +
                          " --tp 2 --threads 1 --progress-interval 0.05 --max-seqs 4 --comm-timeout " +
                          std::to_string(comm_timeout) + extra + " --out " + marker;
  const std::string cmd = job + " > " + log + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen(cmd.c_str(), "r");
  std::map<int, pid_t> ranks;
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ranks = ranks_of_job(marker);
    if (ranks.size() == 2 && test::read_file(log).find("[shardlm] replica 0:") != std::string::npos) break;
  }
  if (ranks.count(1)) kill(ranks[1], sig);
  // A job that has not ended 90 s on has hung: its ranks are killed so that the test fails now (on
  // its time) instead of at the CTest timeout.
  const auto t_sig = std::chrono::steady_clock::now();
  auto alive = [&] {
    for (const auto& [rank, pid] : ranks) {
      if (kill(pid, 0) == 0) return true;
    }
    return false;
  };
  while (alive() && std::chrono::steady_clock::now() - t_sig < std::chrono::seconds(90))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (alive()) {
    for (const auto& [rank, pid] : ranks) kill(pid, SIGKILL);
  }
  FaultRun r;
  r.command = job;
  r.out = marker;
  const int st = pclose(f);
  r.proc.out = test::read_file(log);
  r.proc.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sig == SIGSTOP && ranks.count(1)) kill(ranks[1], SIGKILL);  // in case it is still there
  EXPECT_EQ(ranks.size(), 2u) << "did not find both ranks of the job";
  return r;
}

// A rank killed outright: the launcher sees it exit and ends the job, naming the rank and the
// signal (Open MPI's mpiexec: "process rank 1 ... exited on signal 9"); its peer, waiting in a
// collective, must not keep the job alive. What rank 0 had committed stays readable and whole, and
// --resume finishes the job: every request once, each the greedy reference.
TEST(Faults, KilledRankEndsTheJobNamingIt) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  FaultRun r = run_with_fault(SIGKILL, "kill", 10);
  EXPECT_NE(r.proc.code, 0) << r.proc.out;
  EXPECT_LT(r.seconds, 60);
  EXPECT_TRUE(std::regex_search(r.proc.out, std::regex("process rank 1 .* exited on signal 9"))) << r.proc.out;

  // Every request of the job is prompt [1], 300 tokens, greedy: the reference's 200 tokens first.
  const std::vector<int32_t> reference = test::read_ids(model + "/expected_greedy_from_bos.ids");
  auto expect_whole_rows = [&](const char* when) -> std::vector<std::string> {
    test::H5Reader h(r.out);
    EXPECT_TRUE(h.ok()) << when << ": the file must stay readable";
    const auto ids = h.strings("/requests/id");
    const auto outs = h.lists<int32_t>("/requests/output_tokens", H5T_NATIVE_INT32);
    EXPECT_EQ(outs.size(), ids.size()) << when;
    for (size_t i = 0; i < std::min(ids.size(), outs.size()); ++i) {
      EXPECT_EQ(outs[i].size(), 300u) << when << ": row " << i << " (" << ids[i] << ")";
      if (outs[i].size() < reference.size()) continue;
      EXPECT_TRUE(std::equal(reference.begin(), reference.end(), outs[i].begin()))
          << when << ": row " << i << " (" << ids[i] << ") is not the greedy reference";
    }
    return ids;
  };
  const size_t committed = expect_whole_rows("after the kill").size();
  EXPECT_LT(committed, 400u);

  Proc resumed = sh(r.command + " --resume -q");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  const auto ids = expect_whole_rows("after --resume");
  std::set<std::string> want, got(ids.begin(), ids.end());
  for (int i = 0; i < 400; ++i) want.insert("f" + std::to_string(i));
  EXPECT_EQ(ids.size(), 400u);
  EXPECT_EQ(got, want);
}

// A rank that stops answering (not dead, so the launcher does not notice) makes its peers' waits
// time out: the job ends with a message naming the group and the silent rank, and does not hang.
TEST(Faults, HungRankTimesOutNamingGroupAndPeer) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  FaultRun r = run_with_fault(SIGSTOP, "stop", 3);
  EXPECT_NE(r.proc.code, 0) << r.proc.out;
  EXPECT_LT(r.seconds, 60);
  EXPECT_NE(r.proc.out.find("timed out after 3 s"), std::string::npos) << r.proc.out;
  EXPECT_NE(r.proc.out.find("peers: world rank 1"), std::string::npos) << r.proc.out;
}

// The same on the libfabric communicator: the tp group's waits are its own (not MPI's) and must
// end the job the same way.
TEST(Faults, HungRankOnFabricTimesOutNamingPeer) {
#ifndef SHARDLM_HAVE_LIBFABRIC
  GTEST_SKIP() << "built without libfabric: no --comm fabric";
#else
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  FaultRun r = run_with_fault(SIGSTOP, "stop-fabric", 3, " --comm fabric");
  EXPECT_NE(r.proc.code, 0) << r.proc.out;
  EXPECT_LT(r.seconds, 60);
  EXPECT_NE(r.proc.out.find("timed out after 3 s"), std::string::npos) << r.proc.out;
  EXPECT_NE(r.proc.out.find("world rank 1"), std::string::npos) << r.proc.out;
#endif
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

struct RankMemory {
  std::vector<int64_t> rss, load;
};

RankMemory rank_memory(const std::string& h5) {
  test::H5Reader h(h5);
  return {h.scalars<int64_t>("/ranks/peak_rss_bytes", H5T_NATIVE_INT64), h.scalars<int64_t>("/ranks/load_bytes", H5T_NATIVE_INT64)};
}

// Through pipeline stages, the last stage samples each step on its own backend and sends the
// leader only the choices: 4 bytes of token and 4 of logprob per logit row (a generated token, or
// a scored prompt position of a request with prompt logprobs) and 8 per top alternative, not a row
// of logits (2 KiB each here). The tokens are the single-rank ones
// (Stories260KEveryLayoutMatchesOneRank).
TEST(Layouts, LastStageSendsChoicesNotLogits) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = test::fresh_dir("choices");
  test::write_layout_prompts(d / "p.jsonl", 12, false);
  for (const Layout& l : {Layout{1, 2, 1}, Layout{2, 2, 1}}) {
    const std::string out = (d / (name(l) + ".h5")).string();
    Proc p = sh(mpirun(l.tp * l.pp) + shardlm_bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                " --threads 1 -q --seed 3 --max-seqs 5 --max-batch-tokens 48 --tp " + std::to_string(l.tp) + " --pp " +
                std::to_string(l.pp) + " --out " + out);
    ASSERT_EQ(p.code, 0) << name(l) << "\n" << p.out;
    const test::RunOutput run = test::read_run(out);
    int64_t generated = 0, rows = 0, alternatives = 0;
    for (const auto& [id, toks] : run.tokens) {
      generated += static_cast<int64_t>(toks.size());
      const size_t prompt = run.prompt_lps.at(id).size();
      // The first prompt position has nothing before it: no row, and its alternatives are padding.
      const int64_t scored = prompt > 0 ? static_cast<int64_t>(prompt) - 1 : 0;
      rows += static_cast<int64_t>(toks.size()) + scored;
      alternatives += static_cast<int64_t>(run.top_ids.at(id).size());
      if (prompt > 0) alternatives += static_cast<int64_t>(run.prompt_top_ids.at(id).size() / prompt) * scored;
    }
    ASSERT_GT(generated, 100) << name(l);
    ASSERT_GT(rows, generated) << name(l) << ": the layout prompts score some prompts";
    test::H5Reader h(out);
    const auto stage = h.scalars<int32_t>("/ranks/pp", H5T_NATIVE_INT32);
    const auto tp = h.scalars<int32_t>("/ranks/tp", H5T_NATIVE_INT32);
    const auto sent = h.scalars<int64_t>("/ranks/pp_bytes_sent", H5T_NATIVE_INT64);
    ASSERT_EQ(sent.size(), static_cast<size_t>(l.tp * l.pp)) << name(l);
    // Besides the choices, each step the stages' figures (arch/stage_figures.h; a dense model: 4
    // MoE slots and 2 per stage, int64) go to the leader.
    const int64_t steps = static_cast<int64_t>(h.rows("/steps/step"));
    const int64_t figures = 8 * (4 + 2 * l.pp);
    for (size_t r = 0; r < sent.size(); ++r) {
      if (stage[r] != l.pp - 1) continue;
      EXPECT_EQ(sent[r], tp[r] == 0 ? 8 * rows + 8 * alternatives + figures * steps : 0) << name(l) << " rank " << r;
    }
  }
}

// On a 41 MB model, a rank of a sharded layout loads 1/(tp x pp) of the weights, and its peak
// resident memory is lower than a single rank's by most of what it did not load.
TEST(Memory, RankHoldsAboutItsShard) {
  fs::path d = test::fresh_dir("memory");
  test::write_file(d / "config.json",
                   R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                       "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 256,
                       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
                       "bos_token_id": 1, "eos_token_id": 2})");
  const std::string model = (d / "model").string();
  ASSERT_EQ(sh(shardlm_bin() + " make-model --config " + (d / "config.json").string() + " --out " + model +
               " --dtype bf16 --seed 1").code, 0);
  test::write_file(d / "p.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 4}\n");
  const std::string args = " run --model " + model + " --prompts " + (d / "p.jsonl").string() + " -q --threads 1 --kv-cache-gb 0.01";
  ASSERT_EQ(sh(shardlm_bin() + args + " --out " + (d / "one.h5").string()).code, 0);
  const RankMemory one = rank_memory((d / "one.h5").string());
  ASSERT_EQ(one.load.size(), 1u);
  EXPECT_GT(one.load[0], 40'000'000);
  for (const Layout& l : {Layout{2, 1, 1}, Layout{2, 2, 1}}) {
    const std::string out = (d / (name(l) + ".h5")).string();
    Proc p = sh(mpirun(l.tp * l.pp) + shardlm_bin() + args + " --tp " + std::to_string(l.tp) + " --pp " +
                std::to_string(l.pp) + " --out " + out);
    ASSERT_EQ(p.code, 0) << p.out;
    const RankMemory m = rank_memory(out);
    ASSERT_EQ(m.load.size(), static_cast<size_t>(l.tp * l.pp));
    for (size_t r = 0; r < m.load.size(); ++r) {
      const int64_t not_loaded = one.load[0] - m.load[r];
      // A stage also holds its share of the embedding or the LM head, so shards are near, not exactly, 1/n.
      EXPECT_GT(not_loaded, one.load[0] / 3) << name(l) << " rank " << r;
      EXPECT_GE(one.rss[0] - m.rss[r], not_loaded * 7 / 10)
          << name(l) << " rank " << r << ": rss " << m.rss[r] << " vs one rank's " << one.rss[0];
    }
  }
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

// A float32 .npy file's values (the layout `shardlm score` writes).
std::vector<float> read_npy_f32(const std::string& path) {
  const std::string bytes = test::read_file(path);
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return {};
  const size_t header = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
  const size_t at = 10 + header;
  std::vector<float> v((bytes.size() - at) / sizeof(float));
  std::memcpy(v.data(), bytes.data() + at, v.size() * sizeof(float));
  return v;
}

// The full logits at every position, not only the chosen tokens': tensor parallelism sums partial
// products in another order, so they agree within 1e-4 + 1e-5 x max|logit|; pipeline stages alone
// give the same bits.
TEST(Layouts, FullLogitsMatchOneRank) {
  SHARDLM_REQUIRE_SHARED(model, "models/stories260K");
  fs::path d = test::fresh_dir("logits");
  const std::string ids = "1 403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337";
  Proc one = sh(shardlm_bin() + " score --model " + model + " --ids '" + ids + "' --out " + (d / "one.npy").string());
  ASSERT_EQ(one.code, 0) << one.out;
  const std::vector<float> ref = read_npy_f32((d / "one.npy").string());
  ASSERT_EQ(ref.size(), 21u * 512);
  float scale = 0;
  for (float x : ref) scale = std::max(scale, std::fabs(x));
  const float tol = 1e-4f + 1e-5f * scale;
  for (const Layout& l : {Layout{2, 1, 1}, Layout{4, 1, 1}, Layout{1, 3, 1}, Layout{2, 2, 1}}) {
    const std::string out = (d / (name(l) + ".npy")).string();
    Proc p = sh(mpirun(l.tp * l.pp) + shardlm_bin() + " score --model " + model + " --ids '" + ids + "' --threads 1 --tp " +
                std::to_string(l.tp) + " --pp " + std::to_string(l.pp) + " --out " + out);
    ASSERT_EQ(p.code, 0) << name(l) << "\n" << p.out;
    const std::vector<float> got = read_npy_f32(out);
    ASSERT_EQ(got.size(), ref.size()) << name(l);
    float worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]));
    EXPECT_LE(worst, tol) << name(l);
    if (l.tp == 1) {
      EXPECT_EQ(worst, 0.0f) << name(l) << ": stages alone change no reduction order";
    }
  }
}

// Tied embeddings saved as lm_head.weight alone (transformers ties them whichever of the two the
// file holds): the same logits as the file that names them model.embed_tokens.weight, on one rank
// and with the vocabulary split over two.
TEST(Layouts, TiedEmbeddingsSavedAsLmHead) {
  const std::string model = test::tiny_model_dir("tiny-qwen2");  // tie_word_embeddings: true
  fs::path d = test::fresh_dir("tied-lm-head");
  fs::path renamed = d / "m";
  fs::create_directories(renamed);
  for (const auto& entry : fs::directory_iterator(model))
    if (entry.path().extension() != ".safetensors") fs::copy_file(entry.path(), renamed / entry.path().filename());
  {
    auto ck = Checkpoint::open(model);
    ASSERT_FALSE(ck->has("lm_head.weight"));
    std::vector<SafetensorsWriteItem> items;
    for (const std::string& name : ck->names()) {
      const TensorView& t = ck->get(name);
      items.push_back({name == "model.embed_tokens.weight" ? "lm_head.weight" : name, t.dtype, t.shape, t.data});
    }
    write_safetensors((renamed / "model.safetensors").string(), items);
  }
  const std::string ids = "1 5 9 200 13 77 301 4";
  for (const int tp : {1, 2}) {
    std::vector<float> logits[2];
    for (int k = 0; k < 2; ++k) {
      const std::string out = (d / ("l" + std::to_string(tp) + std::to_string(k) + ".npy")).string();
      Proc p = sh(mpirun(tp) + shardlm_bin() + " score --model " + (k ? renamed.string() : model) + " --ids '" + ids +
                  "' --threads 1 --tp " + std::to_string(tp) + " --out " + out);
      ASSERT_EQ(p.code, 0) << p.out;
      logits[k] = read_npy_f32(out);
    }
    ASSERT_EQ(logits[0].size(), 8u * 512);
    EXPECT_EQ(logits[0], logits[1]) << "tp " << tp;
  }
}

}  // namespace
}  // namespace shardlm
