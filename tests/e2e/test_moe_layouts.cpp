// Mixture-of-Experts models under expert, attention data, tensor and pipeline parallelism: every
// layout gives the single-rank tokens, a rank holds 1/ep of the routed-expert bytes, and the
// per-step expert figures reach /steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/cli_runner.h"
#include "common/h5_read.h"
#include "common/layout_check.h"
#include "common/test_files.h"
#include "model/checkpoint.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

using test::LayoutRun;
using test::Proc;
using test::sh;
using test::shardlm_bin;

std::string make(const std::string& config, const std::string& dtype) {
  const fs::path d = test::fresh_dir("moe-model-" + config + "-" + dtype);
  const std::string dir = (d / "m").string();
  Proc made = sh(shardlm_bin() + " make-model --config " + std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" +
                 config + ".json --out " + dir + " --dtype " + dtype + " --seed 5");
  EXPECT_EQ(made.code, 0) << made.out;
  return dir;
}

// DeepSeek-V3 shape (MLA, YaRN, 16 experts in 4 groups, a dense first layer, a shared expert):
// expert parallelism over dp groups, over tp x dp, combined with pipeline stages, and the experts
// split over tp instead (--ep 1).
TEST(MoeLayouts, DeepseekV3EveryLayoutMatchesOneRank) {
  const std::string model = make("tiny-deepseek-v3", "bf16");
  test::check_layout_runs(model,
                          {{2, "--dp 2 --ep 2"},
                           {4, "--dp 4 --ep 4"},
                           {4, "--dp 2 --tp 2 --ep 4"},
                           {2, "--tp 2"},
                           {4, "--pp 2 --dp 2 --ep 2"},
                           {8, "--pp 2 --dp 2 --tp 2 --ep 4"}},
                          true, "deepseek-v3");
}

// The expert all-to-alls, the tp collectives and the stage hand-offs on the libfabric
// communicator.
TEST(MoeLayouts, DeepseekV3OverFabricMatchesOneRank) {
#ifndef SHARDLM_HAVE_LIBFABRIC
  GTEST_SKIP() << "built without libfabric: no --comm fabric";
#else
  test::check_layout_runs(make("tiny-deepseek-v3", "bf16"),
                          {{4, "--dp 2 --tp 2 --ep 4 --comm fabric"}, {4, "--pp 2 --dp 2 --ep 2 --comm fabric"}}, true,
                          "deepseek-v3-fabric");
#endif
}

// Mixtral's 8 experts over 8 ranks: one expert per rank, and with 12 prompts on 8 dp groups some
// groups run out of work early and step empty while the others finish. With pipeline stages the
// step rows count the experts of every stage's layers (the later stages' figures travel to the
// leader), not only the first stage's.
TEST(MoeLayouts, MixtralOneExpertPerRank) {
  const std::string model = make("tiny-mixtral", "bf16");
  const std::vector<LayoutRun> layouts = {
      {8, "--dp 8 --ep 8"}, {4, "--tp 2 --dp 2 --ep 4"}, {3, "--pp 3"}, {4, "--pp 2 --dp 2 --ep 2"}};
  const auto outs = test::check_layout_runs(model, layouts, false, "mixtral");
  ASSERT_EQ(outs.size(), layouts.size());
  // Steps record dispatch/combine figures (with ep) and the tokens each expert received, in every
  // layout (with tp 2 each tp rank routes half of its group's tokens).
  for (size_t l = 0; l < outs.size(); ++l) {
    const std::string& out = outs[l];
    test::H5Reader h(out);
    const auto experts = h.lists<int32_t>("/steps/expert_tokens", H5T_NATIVE_INT32);
    const auto dispatch = h.scalars<int64_t>("/steps/moe_dispatch_bytes", H5T_NATIVE_INT64);
    const auto prefill = h.scalars<int32_t>("/steps/prefill_tokens", H5T_NATIVE_INT32);
    const auto decode = h.scalars<int32_t>("/steps/decode_tokens", H5T_NATIVE_INT32);
    ASSERT_FALSE(experts.empty());
    int64_t bytes = 0;
    bool some_expert_idle = false;
    for (size_t i = 0; i < experts.size(); ++i) {
      ASSERT_EQ(experts[i].size(), 8u);
      const int64_t routed = std::accumulate(experts[i].begin(), experts[i].end(), int64_t{0});
      // Every token of the step goes to 2 experts in each of the 3 MoE layers.
      EXPECT_EQ(routed, 2 * 3 * (prefill[i] + decode[i])) << out << " step " << i;
      for (int32_t n : experts[i]) some_expert_idle |= n == 0;
      bytes += dispatch[i];
    }
    EXPECT_TRUE(some_expert_idle) << out << ": no step left an expert without tokens";
    if (layouts[l].flags.find("--ep") != std::string::npos) {
      EXPECT_GT(bytes, 0) << out;
    }
  }
}

// --op-profile with expert parallelism (tiny-mixtral, 3 MoE layers, 2 attention data-parallel
// groups): the tokens stay the single-rank ones, and each rank's steps show its exchanges, one
// dispatch and one combine per MoE layer a step, in its steps with tokens and in the empty steps it
// runs while the other group works (its turn in the all-to-alls), which do no other layer work.
// (Which steps a rank runs empty depends on how the groups claim the prompts: the rows are checked
// as they come.)
TEST(MoeLayouts, OpProfileShowsTheExchanges) {
  const std::string model = make("tiny-mixtral", "bf16");
  const auto outs = test::check_layout_runs(model, {{2, "--dp 2 --ep 2 --op-profile"}}, false, "mixtral-op-profile");
  ASSERT_EQ(outs.size(), 1u);
  test::H5Reader h(outs[0]);
  const auto rank = h.scalars<int32_t>("/op_profile/rank", H5T_NATIVE_INT32);
  const auto kind = h.strings("/op_profile/kind");
  const auto section = h.strings("/op_profile/section");
  const auto steps = h.scalars<int64_t>("/op_profile/steps", H5T_NATIVE_INT64);
  const auto calls = h.scalars<int64_t>("/op_profile/calls", H5T_NATIVE_INT64);
  std::set<std::pair<int32_t, std::string>> seen;
  std::set<std::tuple<int32_t, std::string, std::string>> sections;
  for (size_t i = 0; i < rank.size(); ++i) {
    seen.insert({rank[i], kind[i]});
    sections.insert({rank[i], kind[i], section[i]});
    const std::string& s = section[i];
    if (s == "ep dispatch" || s == "ep combine" || s == "moe experts") {
      EXPECT_EQ(calls[i], 3 * steps[i]) << rank[i] << " " << kind[i] << " " << s;
    }
    if (kind[i] == "empty") {
      EXPECT_TRUE(s == "ep dispatch" || s == "ep combine" || s == "moe experts" || s == "step inputs" ||
                  s == "embedding")
          << "an empty step ran '" << s << "'";
    } else if (s == "attn core" || s == "moe routing") {
      EXPECT_EQ(calls[i], 3 * steps[i]) << rank[i] << " " << kind[i] << " " << s;
    }
  }
  for (const auto& [r, k] : seen) {
    for (const char* x : {"ep dispatch", "moe experts", "ep combine"})
      EXPECT_TRUE(sections.count({r, k, x})) << "rank " << r << " " << k << " steps without '" << x << "'";
  }
  // Which group claims which prompts is the queue's business: some rank ran each kind, and every
  // rank has rows.
  for (const char* k : {"prefill", "decode"}) EXPECT_TRUE(seen.count({0, k}) || seen.count({1, k})) << k;
  EXPECT_TRUE(std::count(rank.begin(), rank.end(), 0) > 0 && std::count(rank.begin(), rank.end(), 1) > 0);
}

// Qwen2-MoE's gated shared expert and Qwen3-MoE's dense mlp_only layer, and a Kimi-K2-shaped model
// (one expert group) in fp8 with block scales, its latent KV cache in fp8 too.
TEST(MoeLayouts, QwenMoeAndKimiFp8) {
  test::check_layout_runs(make("tiny-qwen2-moe", "bf16"), {{4, "--dp 2 --tp 2 --ep 4"}, {2, "--tp 2"}}, false,
                          "qwen2-moe");
  test::check_layout_runs(make("tiny-qwen3-moe", "bf16"), {{4, "--dp 4 --ep 4"}, {2, "--pp 2"}}, false, "qwen3-moe");
  test::check_layout_runs(make("tiny-kimi-k2", "fp8"), {{4, "--dp 4 --ep 4"}, {4, "--dp 2 --tp 2 --ep 4"}}, false,
                          "kimi-k2-fp8", " --kv-dtype fp8");
}

// With --ep 4 each rank reads every non-expert tensor and a quarter of the routed experts' bytes,
// exactly.
TEST(MoeLayouts, RankLoadsItsQuarterOfTheExperts) {
  const std::string model = make("tiny-deepseek-v3", "bf16");
  auto ckpt = Checkpoint::open(model);
  int64_t experts = 0, total = 0;
  for (const std::string& n : ckpt->names()) {
    const int64_t b = static_cast<int64_t>(ckpt->get(n).nbytes);
    total += b;
    if (n.find(".mlp.experts.") != std::string::npos) experts += b;
  }
  ASSERT_GT(experts, total / 2);
  const fs::path d = test::fresh_dir("moe-memory");
  test::write_file(d / "p.jsonl", "{\"id\": \"a\", \"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 2}\n");
  const std::string out = (d / "o.h5").string();
  Proc p = sh(test::mpirun(4) + shardlm_bin() + " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
              " -q --threads 1 --dp 4 --ep 4 --out " + out);
  ASSERT_EQ(p.code, 0) << p.out;
  test::H5Reader h(out);
  const auto load = h.scalars<int64_t>("/ranks/load_bytes", H5T_NATIVE_INT64);
  ASSERT_EQ(load.size(), 4u);
  for (int64_t l : load) EXPECT_EQ(l, total - experts + experts / 4);
}

// SIGTERM (what Slurm sends on preemption) to an expert-parallel job: the dp leaders agree to stop
// at the same step, so no rank waits on an all-to-all that never comes; the file is valid, and
// --resume finishes it with the uninterrupted tokens. (Results of the second group travel to the
// writer while the groups step in lockstep: a blocking send there once deadlocked the job.)
TEST(MoeLayouts, SigtermStopsEveryGroupTogetherAndResumeFinishes) {
  const std::string model = make("tiny-mixtral", "bf16");
  const fs::path d = test::fresh_dir("moe-term");
  std::string lines;
  // Long enough that the run is still going when the signal comes, on any machine: the
  // interrupted run takes one sequence at a time per group; the others use bigger batches, which
  // give the same tokens (batch invariance).
  for (int i = 0; i < 48; ++i) {
    lines += "{\"id\": \"t" + std::to_string(i) + "\", \"prompt\": \"Once upon a time\", \"max_tokens\": 600, " +
             "\"ignore_eos\": true, \"temperature\": 0.7}\n";
  }
  test::write_file(d / "p.jsonl", lines);
  const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                             " --threads 1 --flush-every 2 --seed 4 --comm-timeout 60";
  Proc full = sh(shardlm_bin() + common + " -q --max-seqs 16 --out " + (d / "full.h5").string());
  ASSERT_EQ(full.code, 0) << full.out;
  const test::RunOutput reference = test::read_run((d / "full.h5").string());

  const std::string out = (d / "term.h5").string();
  std::vector<std::string> argv = {SHARDLM_MPIEXEC, "--oversubscribe", "-np", "2", shardlm_bin()};
  std::istringstream words(common + " --max-seqs 1 --dp 2 --ep 2 --progress-interval 0.02 --out " + out);
  for (std::string w; words >> w;) argv.push_back(w);
  test::mpirun(2);  // sets the environment Open MPI needs to run as root
  const std::string log = (d / "term.log").string();
  const pid_t pid = test::spawn(argv, log);
  // Mid-run: a group has finished two requests. (mpirun forwards the ranks' stderr with some delay,
  // which the run's length, seconds more, covers.)
  const std::regex done("replica [01]: ([0-9]+)/");
  for (int i = 0; i < 3000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::string text = test::read_file(log);
    int finished = 0;
    for (std::sregex_iterator it(text.begin(), text.end(), done), end; it != end; ++it) {
      finished = std::max(finished, std::stoi((*it)[1]));
    }
    if (finished >= 2) break;
  }
  kill(pid, SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  const int code = test::wait_exit(pid);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(code, 0);
  EXPECT_LT(secs, 30.0) << "the job took " << secs << " s to stop";
  {
    test::H5Reader h(out);
    ASSERT_TRUE(h.ok()) << test::read_file(log);
    EXPECT_EQ(h.scalar_attr<int64_t>("interrupted_by_signal", H5T_NATIVE_INT64), SIGTERM) << test::read_file(log);
    const auto ids = h.strings("/requests/id");
    EXPECT_LT(ids.size(), 48u);
  }
  Proc resumed = sh(test::mpirun(2) + shardlm_bin() + common + " -q --max-seqs 16 --dp 2 --ep 2 --resume --out " + out);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  test::H5Reader h(out);
  const auto ids = h.strings("/requests/id");
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size()) << "an id appears twice";
  EXPECT_EQ(test::read_run(out).tokens, reference.tokens);
}

// The fp8 scale blocks are the config's weight_block_size: a config that says 64 x 64 about a
// checkpoint quantised in 128 x 128 blocks fails at load, naming the weight and its scales.
TEST(MoeLayouts, Fp8BlockSizeComesFromTheConfig) {
  const std::string model = make("tiny-kimi-k2", "fp8");
  std::string config = test::read_file(fs::path(model) / "config.json");
  const size_t at = config.find("\"weight_block_size\"");
  ASSERT_NE(at, std::string::npos);
  const size_t end = config.find(']', at);
  config.replace(at, end + 1 - at, "\"weight_block_size\": [64, 64]");
  test::write_file(fs::path(model) / "config.json", config);
  Proc p = sh(shardlm_bin() + " score --model " + model + " --ids '1 2 3' --out " +
              (fs::path(model) / "l.npy").string());
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("64x64 blocks needs scales of shape"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("_scale_inv"), std::string::npos) << p.out;
}

// --ep-wire bf16 or fp8: every layout with ep gives the same tokens and logprobs, bit for bit (ep
// over dp groups, more of them, and with pipeline stages); against the single rank, which rounds
// nothing, every logprob of a common prefix stays within `tol`, and with bf16 the greedy requests
// keep their tokens (measured: at most 0.017 on this model and on the DeepSeek-V3-shaped one,
// sampled requests parting after 7-30 tokens; the rounding moves a sampled token's threshold; fp8's
// 3-bit mantissa moves more: at most 0.20, and 5 of the 6 greedy requests part, so fp8 is checked
// to 0.5 on the common prefixes; the run prints both figures; the error against transformers is in
// tests/ep_wire_hf_compare.py). Layouts with tp are not among the bit-identical ones: their partial
// sums differ in the last bits already, and the rounding can carry that to the neighbouring bf16
// (measured: 0.007). Without ep nothing is rounded (and the run says so); a bad name is refused.
void check_wire_layouts(const std::string& wire, float tol, bool greedy_kept) {
  const std::string model = make("tiny-mixtral", "bf16");
  const fs::path d = test::fresh_dir("moe-" + wire + "-wire");
  test::write_layout_prompts(d / "p.jsonl", 12, true);
  const std::string common = " run --model " + model + " --prompts " + (d / "p.jsonl").string() +
                             " --threads 1 -q --seed 3 --max-seqs 5 --max-batch-tokens 48 --out ";
  Proc one = sh(shardlm_bin() + common + (d / "one.h5").string());
  ASSERT_EQ(one.code, 0) << one.out;
  const test::RunOutput single = test::read_run((d / "one.h5").string());
  struct Run {
    int ranks;
    const char* flags;
  };
  std::vector<test::RunOutput> runs;
  for (const Run& r : {Run{2, "--dp 2 --ep 2"}, Run{4, "--dp 4 --ep 4"}, Run{4, "--pp 2 --dp 2 --ep 2"}}) {
    const std::string out = (d / ("ep" + std::to_string(runs.size()) + ".h5")).string();
    Proc p = sh(test::mpirun(r.ranks) + shardlm_bin() + common + out + " " + r.flags + " --ep-wire " + wire);
    ASSERT_EQ(p.code, 0) << r.flags << "\n" << p.out;
    runs.push_back(test::read_run(out));
    if (runs.size() > 1) {
      EXPECT_EQ(runs.back().tokens, runs.front().tokens) << r.flags;
      EXPECT_EQ(runs.back().logprobs, runs.front().logprobs) << r.flags << ": logprobs not bit-identical";
    }
  }
  const test::RunOutput& on_wire = runs.front();
  bool any_differs = false;
  float worst = 0.0f;
  int greedy_parted = 0;
  for (const auto& [id, toks] : single.tokens) {
    const auto& got = on_wire.tokens.at(id);
    const bool greedy = std::stoi(id.substr(1)) % 2 == 0;  // write_layout_prompts samples the odd ones
    if (greedy && greedy_kept) {
      EXPECT_EQ(got, toks) << "greedy request " << id;
    }
    greedy_parted += greedy && got != toks;
    const auto& la = single.logprobs.at(id);
    const auto& lb = on_wire.logprobs.at(id);
    for (size_t i = 0; i < std::min(toks.size(), got.size()) && toks[i] == got[i]; ++i) {
      EXPECT_LE(std::fabs(la[i] - lb[i]), tol) << id << " token " << i;
      any_differs |= la[i] != lb[i];
      worst = std::max(worst, std::fabs(la[i] - lb[i]));
    }
  }
  std::printf(
      "--ep-wire %s against the single rank: largest logprob change %.4g (tolerance %g), %d greedy "
      "requests parted\n",
      wire.c_str(), worst, tol, greedy_parted);
  EXPECT_TRUE(any_differs) << "the " << wire << " wire changed no logprob: were the rows rounded?";
  // Without ep there is no exchange: the run says so and gives the plain single-rank bits.
  Proc alone = sh(shardlm_bin() + common + (d / "alone.h5").string() + " --ep-wire " + wire);
  ASSERT_EQ(alone.code, 0) << alone.out;
  EXPECT_NE(alone.out.find("--ep-wire " + wire + ": no expert-parallel exchange in this layout (ep 1)"),
            std::string::npos)
      << alone.out;
  EXPECT_EQ(test::read_run((d / "alone.h5").string()).logprobs, single.logprobs);
  Proc bad = sh(test::mpirun(2) + shardlm_bin() + common + (d / "bad.h5").string() + " --dp 2 --ep 2 --ep-wire fp4");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--ep-wire fp4: expected fp32, bf16 or fp8"), std::string::npos) << bad.out;
}

TEST(MoeLayouts, Bf16WireGivesOneResultForEveryEpLayout) { check_wire_layouts("bf16", 0.05f, true); }
TEST(MoeLayouts, Fp8WireGivesOneResultForEveryEpLayout) { check_wire_layouts("fp8", 0.5f, false); }

TEST(MoeLayouts, RefusesExpertLayoutsThatDoNotFit) {
  const std::string model = make("tiny-mixtral", "bf16");
  const fs::path d = test::fresh_dir("moe-bad");
  test::write_file(d / "p.txt", "hello\n");
  const std::string args = " run --model " + model + " --prompts " + (d / "p.txt").string() + " --out " +
                           (d / "o.h5").string() + " -q --threads 1";
  Proc half = sh(test::mpirun(4) + shardlm_bin() + args + " --dp 4 --ep 2");
  EXPECT_NE(half.code, 0);
  EXPECT_NE(half.out.find("--ep 2 must be 1 or dp x tp = 4"), std::string::npos) << half.out;
  Proc three = sh(test::mpirun(3) + shardlm_bin() + args + " --dp 3 --ep 3");
  EXPECT_NE(three.code, 0);
  EXPECT_NE(three.out.find("--ep 3 does not divide the 8 routed experts"), std::string::npos) << three.out;
}

}  // namespace
}  // namespace shardlm
