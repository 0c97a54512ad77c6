// shardlm bench end to end on the CPU backend at small sizes: every part of the report (the
// machine's ceilings, prefill, decode, batched, sampling, attention decode and prefill for each
// cache dtype) is printed with positive figures. The figures are this machine's; what they are
// measured against is the bench's own business (cmd_bench.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/bench_report.h"
#include "common/cli_runner.h"
#include "common/shared_data.h"
#include "common/tiny_model.h"
#include "plan/model_footprint.h"

namespace shardlm {
namespace {

using test::Proc;
using test::sh;

TEST(BenchCli, Stories260kReportsEveryPart) {
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
  Proc r = sh(std::string(SHARDLM_BINARY) + " bench --model " + stories +
              " --threads 1 --prompt-len 48 --decode-tokens 4 --batch 3 --batch-in 8 --batch-out 2"
              " --attention-context 5000");
  ASSERT_EQ(r.code, 0) << r.out;
  // stories260K: 8 heads / 4 KV heads, head_dim 8.
  const test::BenchShape s{.prompt_len = 48, .batch = 3, .batch_in = 8, .batch_out = 2, .attention_context = 5000,
                           .heads = 8, .kv_heads = 4, .head_dim = 8};
  test::expect_bench_report(r.out, s);
  EXPECT_NE(r.out.find("KV cache budget 4.0 GiB (auto: 4 GiB on the CPU"), std::string::npos) << r.out;
}

// --op-profile: each scenario's steps' time split by op group, on tiny-llama's 4 layers.
TEST(BenchCli, OpProfileSplitsPrefillAndDecodeSteps) {
  Proc r = sh(std::string(SHARDLM_BINARY) + " bench --model " + test::tiny_model_dir("tiny-llama") +
              " --threads 1 --prompt-len 24 --decode-tokens 5 --batch 3 --batch-in 4 --batch-out 3"
              " --attention-context 0 --op-profile");
  ASSERT_EQ(r.code, 0) << r.out;
  test::expect_op_profile(r.out, 24, 5, 4, 3, 4, 3);
}

// An MoE model: decode streams and multiplies through k of the E routed experts per token, not all
// of them. The bench counts that from the checkpoint's tensors; shardlm plan's footprint, from
// config.json, must give the same active parameters.
TEST(BenchCli, MoeModelCountsTheExpertsATokenUses) {
  const std::string dir = test::tiny_model_dir("tiny-mixtral");
  Proc r = sh(std::string(SHARDLM_BINARY) + " bench --model " + dir +
              " --threads 1 --prompt-len 8 --decode-tokens 2 --batch 1 --batch-in 4 --batch-out 2"
              " --attention-context 0");
  ASSERT_EQ(r.code, 0) << r.out;
  const plan::ModelFootprint fp = plan::ModelFootprint::load(dir);
  char want[128];
  std::snprintf(want, sizeof want,
                "MoE: %lld of %lld routed experts per token: ", static_cast<long long>(fp.experts_per_token),
                static_cast<long long>(fp.n_routed_experts));
  EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  std::snprintf(want, sizeof want, " MB of weights streamed and %.1fM multiplied per token",
                static_cast<double>(fp.active_params_per_token()) / 1e6);
  EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
}

TEST(BenchCli, SkipsAttentionAndGraphsAndRefusesBadSizes) {
  SHARDLM_REQUIRE_SHARED(stories, "models/stories260K");
  const std::string common = std::string(SHARDLM_BINARY) + " bench --model " + stories +
                             " --threads 1 --prompt-len 16 --decode-tokens 2"
                             " --batch 1 --batch-in 4 --batch-out 2";
  Proc r = sh(common + " --attention-context 0 --cuda-graphs");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("attention"), std::string::npos) << r.out;
  // The CPU backend cannot capture: the graph scenarios say why instead of running.
  EXPECT_NE(r.out.find("CUDA graphs: not used (backend cpu cannot capture graphs)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sampling 64 rows"), std::string::npos) << r.out;
  Proc bad = sh(common + " --attention-context -1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("attention-context and peak-gemm 0 or more"), std::string::npos) << bad.out;
  Proc bad_kv = sh(common + " --kv-cache-gb none");
  EXPECT_NE(bad_kv.code, 0);
  EXPECT_NE(bad_kv.out.find("--kv-cache-gb must be auto or a positive number of GiB, not 'none'"), std::string::npos)
      << bad_kv.out;
}

}  // namespace
}  // namespace shardlm
