// The MoE block without expert parallelism runs through backend ops (moe_route, expert_permute,
// expert_gather, expert_combine, gated_add); on the CPU backend its output must equal, bit for bit,
// the host path it replaced: route() on host logits, ExpertDispatch's single-rank gather,
// run_experts(), ExpertDispatch's combine (combine_rows from host-built maps) and the host
// shared-expert epilogue, on the same weights and inputs. Softmax (Mixtral, Qwen2-MoE with its gated shared expert) and sigmoid group-limited
// routing (DeepSeek-V3's shape: bias, 4 groups of which 2 kept, scaling, shared expert), at tp 1 and
// on each tp 2 slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/moe_router.h"
#include "arch/moe_test_util.h"
#include "common/cli_runner.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

struct HostPathResult {
  std::vector<float> out;
  std::vector<int64_t> expert_tokens;
};

// The former ep-1 forward, step by step, on its own backend and loader.
HostPathResult host_path(const MoeCase& c, const Checkpoint& ck, const ShardPlan& plan, const std::vector<float>& x,
                         int64_t T) {
  const MoeSpec& m = c.moe();
  const int64_t H = c.spec.hidden_size, E = m.num_experts, I = m.expert_intermediate, S = m.shared_intermediate;
  auto b = make_backend("cpu");
  WeightLoader w(ck, *b);
  const Matrix router = w.whole(c.router, E, H);
  std::vector<float> bias;
  if (m.score_correction_bias) {
    const Vector v = w.vec(c.bias, E);
    bias.resize(static_cast<size_t>(E));
    b->copy_to_host(bias.data(), v.data, bias.size() * sizeof(float));
  }
  std::vector<ExpertWeights> experts;
  const bool sliced = plan.expert_inter < I;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = c.expert_prefix + std::to_string(e);
    ExpertWeights x;
    x.gate = w.rows(ep + c.gate, I, H, plan.expert_inter0, plan.expert_inter);
    x.up = w.rows(ep + c.up, I, H, plan.expert_inter0, plan.expert_inter);
    x.down = sliced ? w.cols(ep + c.down, H, I, plan.expert_inter0, plan.expert_inter) : w.whole(ep + c.down, H, I);
    experts.push_back(x);
  }
  ExpertWeights shared;
  std::optional<Matrix> shared_gate;
  if (S > 0) {
    const std::string& p = c.shared_prefix;
    shared.gate = w.rows(p + "gate_proj.weight", S, H, plan.shared_inter0, plan.shared_inter);
    shared.up = w.rows(p + "up_proj.weight", S, H, plan.shared_inter0, plan.shared_inter);
    shared.down = plan.shared_inter < S ? w.cols(p + "down_proj.weight", H, S, plan.shared_inter0, plan.shared_inter)
                                        : w.whole(p + "down_proj.weight", H, S);
    if (m.shared_expert_gate) shared_gate = w.whole(c.shared_gate, 1, H);
  }

  Scratch scratch(*b);
  float* h = scratch.get(0, static_cast<size_t>(T * H));
  b->copy_to_device(h, x.data(), x.size() * sizeof(float));
  float* dev_logits = scratch.get(1, static_cast<size_t>(T * E));
  b->linear(h, T, router, nullptr, dev_logits);
  std::vector<float> logits(static_cast<size_t>(T * E));
  b->copy_to_host(logits.data(), dev_logits, logits.size() * sizeof(float));
  Routing r;
  route(m, logits.data(), T, bias.empty() ? nullptr : bias.data(), &r);

  ExpertDispatch d(nullptr, E, H);
  d.dispatch(scratch, h, r);
  LocalExperts local;
  local.assign(std::move(experts));
  run_experts(scratch, local, H, d.input(), d.offsets(), d.output());
  HostPathResult res;
  res.out.resize(static_cast<size_t>(T * H));
  float* out = scratch.get(6, static_cast<size_t>(T * H));
  d.combine(scratch, out);
  b->copy_to_host(res.out.data(), out, res.out.size() * sizeof(float));
  res.expert_tokens.assign(static_cast<size_t>(E), 0);
  for (int32_t e : r.experts) ++res.expert_tokens[e];

  if (S > 0) {
    const int64_t Sl = plan.shared_inter;
    float* g = scratch.get(2, static_cast<size_t>(T * Sl));
    float* u = scratch.get(3, static_cast<size_t>(T * Sl));
    float* y = scratch.get(4, static_cast<size_t>(T * H));
    b->linear(h, T, shared.gate, nullptr, g);
    b->linear(h, T, shared.up, nullptr, u);
    b->silu_mul(g, u, g, T * Sl);
    b->linear(g, T, shared.down, nullptr, y);
    std::vector<float> hy(static_cast<size_t>(T * H)), gate(static_cast<size_t>(T), 1.0f);
    b->copy_to_host(hy.data(), y, hy.size() * sizeof(float));
    if (shared_gate) {
      float* gl = scratch.get(5, static_cast<size_t>(T));
      b->linear(h, T, *shared_gate, nullptr, gl);
      b->copy_to_host(gate.data(), gl, gate.size() * sizeof(float));
      for (float& v : gate) v = 1.0f / (1.0f + std::exp(-v));
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) res.out[t * H + j] += gate[t] * hy[t * H + j];
  }
  return res;
}

using Param = test::MoeParam;

class MoeBackendPath : public testing::TestWithParam<Param> {};

TEST_P(MoeBackendPath, BitIdenticalToHostPath) {
  const Param& p = GetParam();
  const int64_t H = 32, T = 29;
  MoeCase c(p.kind, H, p.E, p.I, p.k, p.S);
  const auto dir = fresh_dir(std::string("moe-backend-") + p.name);
  c.write(dir, 11, p.router_dtype);
  auto ck = Checkpoint::open(dir.string());
  const auto x = moe_hidden(17, T, H);

  for (int tp : {1, 2}) {
    for (int rank = 0; rank < tp; ++rank) {
      const ShardPlan plan = ShardPlan::make(c.spec, rank, tp);
      ASSERT_EQ(plan.ep_size, 1);
      const MoeRun got = run_moe_block(c, *ck, plan, ShardComms{}, x, T);
      const HostPathResult want = host_path(c, *ck, plan, x, T);
      const std::string what = std::string(p.name) + " tp " + std::to_string(tp) + " rank " + std::to_string(rank);
      ASSERT_EQ(got.out.size(), want.out.size()) << what;
      size_t differ = 0;
      double max_diff = 0;
      for (size_t i = 0; i < got.out.size(); ++i) {
        if (std::memcmp(&got.out[i], &want.out[i], sizeof(float)) != 0) ++differ;
        max_diff = std::max(max_diff, std::abs(static_cast<double>(got.out[i]) - want.out[i]));
      }
      EXPECT_EQ(differ, 0u) << what << ": max |diff| " << max_diff;
      EXPECT_EQ(got.stats.expert_tokens, want.expert_tokens) << what;
      EXPECT_EQ(got.stats.dispatch_bytes, 0);
      EXPECT_EQ(got.stats.combine_bytes, 0);
      // Not a vacuous comparison: the layer produced something.
      double norm = 0;
      for (float v : got.out) norm += std::abs(v);
      EXPECT_GT(norm, 0) << what;
    }
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Routers, MoeBackendPath,
    testing::Values(Param{"mixtral", MoeCase::Kind::kMixtral, 8, 12, 2, 0, DType::BF16},
                    Param{"qwen2_gated_shared", MoeCase::Kind::kQwen2, 8, 12, 4, 8, DType::BF16},
                    Param{"qwen3", MoeCase::Kind::kQwen3, 16, 8, 4, 0, DType::F32},
                    Param{"deepseek_v3", MoeCase::Kind::kDeepseek, 16, 12, 4, 8, DType::F32}),
    [](const testing::TestParamInfo<Param>& i) { return std::string(i.param.name); });

}  // namespace
