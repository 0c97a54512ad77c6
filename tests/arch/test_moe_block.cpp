// The MoE block on one rank, on tiny random checkpoints under the three namings (Mixtral, Qwen2
// with its gated shared expert, Qwen3, DeepSeek with bias, groups, scaling and shared experts),
// against a naive double-precision reference; tensor-parallel slices summed; batch invariance;
// statistics; the routed-expert bytes loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "arch/layer_blocks.h"
#include "arch/scratch.h"
#include "arch/shard_plan.h"
#include "arch/weight_loader.h"
#include "arch/moe_test_util.h"
#include "common/cli_runner.h"
#include "common/expect_error.h"
#include "compute/backend.h"
#include "core/error.h"
#include "model/checkpoint.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

MoeRun run_block(const MoeCase& c, const Checkpoint& ck, const ShardPlan& plan, const std::vector<float>& x,
                 int64_t T) {
  return run_moe_block(c, ck, plan, ShardComms{}, x, T);
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]) / (1 + std::abs(want[i]));
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": element " << at << " = " << got[at] << ", reference " << want[at];
}

using Param = test::MoeParam;

class MoeBlockTest : public testing::TestWithParam<Param> {};

TEST_P(MoeBlockTest, MatchesReference) {
  const Param& p = GetParam();
  MoeCase c(p.kind, 16, p.E, p.I, p.k, p.S);
  const auto dir = fresh_dir(std::string("moe-block-") + p.name);
  c.write(dir, 7, p.router_dtype);
  auto ck = Checkpoint::open(dir.string());
  const int64_t T = 9, H = 16;
  const auto x = moe_hidden(3, T, H);
  const auto ref = c.reference(x, T);

  const ShardPlan plan = ShardPlan::make(c.spec);
  MoeRun one = run_block(c, *ck, plan, x, T);
  expect_close(one.out, ref, 2e-6, std::string(p.name) + " tp 1");
  int64_t routed = 0;
  for (int64_t v : one.stats.expert_tokens) routed += v;
  EXPECT_EQ(routed, T * p.k);
  EXPECT_EQ(one.stats.dispatch_bytes, 0);
  EXPECT_EQ(one.stats.combine_bytes, 0);

  // Tensor parallel without expert parallelism: every expert sliced, the partial outputs sum up.
  for (int tp : {2, 4}) {
    std::vector<float> sum(static_cast<size_t>(T * H), 0.0f);
    for (int r = 0; r < tp; ++r) {
      const ShardPlan pr = ShardPlan::make(c.spec, r, tp);
      EXPECT_EQ(pr.expert_inter, p.I / tp);
      MoeRun part = run_block(c, *ck, pr, x, T);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part.out[i];
    }
    expect_close(sum, ref, 4e-6, std::string(p.name) + " tp " + std::to_string(tp));
  }

  // Batch invariance: each token alone gives the same bits as inside the batch.
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    MoeRun alone = run_block(c, *ck, plan, xt, 1);
    for (int64_t j = 0; j < H; ++j) ASSERT_EQ(alone.out[j], one.out[t * H + j]) << p.name << " token " << t;
  }

  // An empty step does nothing.
  MoeRun empty = run_block(c, *ck, plan, x, 0);
  EXPECT_TRUE(empty.out.empty());
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Namings, MoeBlockTest,
                         testing::Values(Param{"mixtral", MoeCase::Kind::kMixtral, 8, 12, 2, 0, DType::BF16},
                                         Param{"qwen2", MoeCase::Kind::kQwen2, 8, 12, 4, 8, DType::BF16},
                                         Param{"qwen3", MoeCase::Kind::kQwen3, 8, 12, 2, 0, DType::F32},
                                         Param{"deepseek", MoeCase::Kind::kDeepseek, 8, 12, 3, 8, DType::F32}),
                         [](const testing::TestParamInfo<Param>& i) { return std::string(i.param.name); });

// The loader reads the router, the bias, the shared expert and this plan's experts only.
TEST(MoeBlock, LoadsOnlyItsExperts) {
  MoeCase c(MoeCase::Kind::kDeepseek, 16, 8, 12, 3, 8);
  const auto dir = fresh_dir("moe-block-bytes");
  c.write(dir, 5);
  auto ck = Checkpoint::open(dir.string());
  const auto x = moe_hidden(1, 2, 16);
  const int64_t H = 16, E = 8;
  const int64_t other = E * H * 4 + E * 4 + 3 * 8 * H * 2;  // router f32, bias f32, shared bf16
  MoeRun all = run_block(c, *ck, ShardPlan::make(c.spec), x, 2);
  EXPECT_EQ(static_cast<int64_t>(all.bytes), other + c.routed_bytes());
  // tp 2 without ep: half of each expert and half of the shared expert.
  MoeRun half = run_block(c, *ck, ShardPlan::make(c.spec, 1, 2), x, 2);
  EXPECT_EQ(static_cast<int64_t>(half.bytes), E * H * 4 + E * 4 + 3 * 4 * H * 2 + c.routed_bytes() / 2);
  std::filesystem::remove_all(dir);
}

// tp 4 over an expert intermediate size of 6: the experts cannot be split over tp, but with expert
// parallelism each rank keeps its experts whole, so the layout is made; with ep 1 it is refused,
// naming the sizes.
TEST(MoeBlock, ExpertParallelismTakesSizesTpDoesNotDivide) {
  ModelSpec s;
  s.architecture = "MixtralForCausalLM";
  s.hidden_size = 16;
  s.intermediate_size = 8;
  s.num_layers = 1;
  s.num_heads = s.num_kv_heads = 4;
  s.head_dim = 4;
  s.vocab_size = 32;
  s.moe.num_experts = 8;
  s.moe.experts_per_token = 2;
  s.moe.expert_intermediate = 6;
  ShardPlan p = ShardPlan::make(s, 1, 4);
  p.set_expert_parallel(s, 3, 4);
  EXPECT_EQ(p.experts, 2);
  EXPECT_EQ(p.expert0, 6);
  EXPECT_EQ(p.expert_inter, 6);
  ShardPlan q = ShardPlan::make(s, 1, 4);
  test::expect_error([&] { q.set_expert_parallel(s, 0, 1); }, {"tp 4 does not divide the expert intermediate size 6"});
}

TEST(MoeBlock, NamingErrors) {
  MoeCase c(MoeCase::Kind::kMixtral, 16, 4, 8, 2);
  const auto dir = fresh_dir("moe-block-errors");
  c.write(dir, 2);
  auto ck = Checkpoint::open(dir.string());
  auto b = make_backend("cpu");
  WeightLoader w(*ck, *b);
  ModelSpec s = c.spec;
  s.moe.shared_intermediate = 8;  // Mixtral has no shared expert
  test::expect_error([&] { make_moe_block(s, ShardPlan::make(s), c.layer, w, ShardComms{}, nullptr); },
                     {"layer 1: the Mixtral naming has no shared expert"});
  s = c.spec;
  s.moe.naming = MoeSpec::Naming::kQwen;  // the tensors are not there under this naming
  test::expect_error([&] { make_moe_block(s, ShardPlan::make(s), c.layer, w, ShardComms{}, nullptr); },
                     {dir.string(), "has no tensor 'model.layers.1.mlp."});
  // Expert parallelism needs its communicator.
  ShardPlan p = ShardPlan::make(c.spec);
  p.set_expert_parallel(c.spec, 0, 2);
  test::expect_error([&] { make_moe_block(c.spec, p, c.layer, w, ShardComms{}, nullptr); },
                     {"layer 1: expert parallelism over 2 ranks needs the ep communicator of that size"});
  std::filesystem::remove_all(dir);
}

}  // namespace
