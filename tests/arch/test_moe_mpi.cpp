// The MoE block with expert parallelism in a real MPI job (run with 2 and 4 ranks): every rank's
// output must equal what the single-rank block (every expert local, no communication) gives for
// its tokens. Layouts: ep = world with one and with two experts per rank; tp 2 x dp (world/2)
// with ep = world, where each tp rank routes its share of the dp group's tokens. Uneven token
// counts, a rank (and a dp group) with no token at all, experts that receive no token. The routed
// sum is taken in a fixed order from unsummed results, so without a tp-sliced shared expert the
// outputs are bit-identical; with one, the tp partial sums round differently (1e-5 relative).
// Each rank loads 1/ep of the routed experts' bytes.
//
// Control flow stays collective: checks use EXPECT_* so a failing rank still takes part in the
// next all-to-all.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/moe_router.h"
#include "arch/moe_test_util.h"
#include "bf16_bits.h"
#include "cpu/fp8_act_quant.h"
#include "fp8_bits.h"
#include "common/test_dirs.h"
#include "compute/cpu_backend.h"
#include "parallel/communicator.h"
#include "parallel/mpi_env.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

constexpr double kTimeout = 60;

int world_rank() { return MpiEnv::rank(); }
int world_size() { return MpiEnv::size(); }

std::unique_ptr<Communicator> comm_of(const std::vector<int>& members, const std::string& name) {
  return make_communicator("mpi", members, name, kTimeout);
}

std::vector<int> all_ranks() {
  std::vector<int> r(static_cast<size_t>(world_size()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<int>(i);
  return r;
}

// This rank's copy of the case's checkpoint (same bytes on every rank), removed at the end.
struct CaseCheckpoint {
  std::filesystem::path dir;
  std::unique_ptr<Checkpoint> ck;
  CaseCheckpoint(MoeCase& c, const std::string& name, uint64_t seed)
      : dir(fresh_dir(name + "-r" + std::to_string(world_rank()))) {
    c.write(dir, seed);
    ck = Checkpoint::open(dir.string());
  }
  ~CaseCheckpoint() {
    ck.reset();
    std::filesystem::remove_all(dir);
  }
  const Checkpoint& operator*() const { return *ck; }
};

// Bytes of everything but the routed experts: router (f32), bias (f32), shared expert and gate.
int64_t other_bytes(const MoeCase& c, int tp) {
  const MoeSpec& m = c.moe();
  const int64_t H = c.spec.hidden_size;
  int64_t b = m.num_experts * H * 4;
  if (!c.bias.empty()) b += m.num_experts * 4;
  b += 3 * (m.shared_intermediate / tp) * H * 2;
  if (!c.shared_gate.empty()) b += H * 2;
  return b;
}

void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << " (world rank " << world_rank() << "): first differing element " << first << " = "
                     << got[first] << ", single-rank " << want[first];
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]) / (1e-3 + std::abs(want[i]));
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, tol) << what << " (world rank " << world_rank() << "): element " << at << " = " << got[at]
                        << ", single-rank " << want[at];
}

// ep = world, tp 1: T[rank] tokens per rank.
void check_ep_world(MoeCase::Kind kind, int64_t per_rank, int64_t k, int64_t S, const std::vector<int64_t>& tokens,
                    const std::string& name) {
  const int n = world_size(), r = world_rank();
  MoeCase c(kind, 16, per_rank * n, 12, k, S);
  CaseCheckpoint ck(c, name, 11);
  auto ep = comm_of(all_ranks(), "ep");
  ShardComms comms;
  comms.ep = ep.get();
  const int64_t T = tokens[static_cast<size_t>(r) % tokens.size()];
  const auto x = moe_hidden(100 + static_cast<uint64_t>(r), T, 16);

  ShardPlan plan = ShardPlan::make(c.spec);
  plan.set_expert_parallel(c.spec, r, n);
  EXPECT_EQ(plan.experts, per_rank);
  EXPECT_EQ(plan.expert0, r * per_rank);
  MoeRun dist = run_moe_block(c, *ck, plan, comms, x, T);
  MoeRun single = run_moe_block(c, *ck, ShardPlan::make(c.spec), ShardComms{}, x, T);
  expect_bits(dist.out, single.out, name + " ep " + std::to_string(n));
  EXPECT_EQ(static_cast<int64_t>(dist.bytes), other_bytes(c, 1) + c.routed_bytes() / n) << name;
  EXPECT_EQ(dist.stats.expert_tokens, single.stats.expert_tokens) << name;
  if (T == 0) {
    EXPECT_EQ(dist.stats.dispatch_bytes, 0) << name;
  }

  // Over the group: every (token, expert) pair counted once; some experts got no token at all
  // when the case is small enough.
  std::vector<int64_t> per_expert = dist.stats.expert_tokens;
  ep->all_reduce(per_expert.data(), per_expert.size(), CommDType::kI64, ReduceOp::kSum);
  int64_t all_tokens = T, moved = dist.stats.dispatch_bytes + dist.stats.combine_bytes;
  ep->all_reduce(&all_tokens, 1, CommDType::kI64, ReduceOp::kSum);
  ep->all_reduce(&moved, 1, CommDType::kI64, ReduceOp::kSum);
  int64_t pairs = 0, idle = 0;
  for (int64_t v : per_expert) pairs += v, idle += v == 0;
  EXPECT_EQ(pairs, all_tokens * k) << name;
  if (all_tokens * k < c.moe().num_experts) {
    EXPECT_GT(idle, 0) << name << ": the case should leave experts idle";
  }
  if (all_tokens >= 8) {
    EXPECT_GT(moved, 0) << name << ": some rows must have crossed ranks";
  }
}

TEST(MoeMpi, OneExpertPerRank) {
  check_ep_world(MoeCase::Kind::kQwen3, 1, 1, 0, {5, 0, 3, 8}, "qwen3-e1");
  check_ep_world(MoeCase::Kind::kQwen3, 1, 2, 0, {0, 7, 1, 2}, "qwen3-e1k2");
}

TEST(MoeMpi, TwoExpertsPerRank) {
  check_ep_world(MoeCase::Kind::kMixtral, 2, 2, 0, {6, 0, 9, 1}, "mixtral-e2");
  check_ep_world(MoeCase::Kind::kDeepseek, 2, 3, 8, {3, 11, 0, 4}, "deepseek-e2");
  check_ep_world(MoeCase::Kind::kQwen2, 2, 3, 8, {4, 2, 5, 0}, "qwen2-e2");
}

TEST(MoeMpi, ExpertsWithoutTokens) {
  // One token in all (on the last rank): most experts receive nothing.
  std::vector<int64_t> t(static_cast<size_t>(world_size()), 0);
  t.back() = 1;
  check_ep_world(MoeCase::Kind::kDeepseek, 2, 2, 0, t, "deepseek-idle");
  std::vector<int64_t> none(static_cast<size_t>(world_size()), 0);
  check_ep_world(MoeCase::Kind::kMixtral, 2, 2, 0, none, "mixtral-empty");
}

// tp 2 x dp (world / 2), ep = world. tokens[d]: the dp group's token count.
void check_tp_dp(MoeCase::Kind kind, int64_t k, int64_t S, const std::vector<int64_t>& tokens,
                 const std::string& name) {
  const int n = world_size(), r = world_rank();
  if (n % 2 != 0) return;
  const int tp = 2, tp_rank = r % tp, d = r / tp;
  MoeCase c(kind, 16, n * 2, 12, k, S);
  CaseCheckpoint ck(c, name, 13);
  auto ep = comm_of(all_ranks(), "ep");
  auto tpc = comm_of({d * tp, d * tp + 1}, "tp");
  ShardComms comms;
  comms.ep = ep.get();
  comms.tp = tpc.get();
  const int64_t T = tokens[static_cast<size_t>(d) % tokens.size()];
  const auto x = moe_hidden(200 + static_cast<uint64_t>(d), T, 16);  // the same on both tp ranks
  ShardPlan plan = ShardPlan::make(c.spec, tp_rank, tp);
  plan.set_expert_parallel(c.spec, r, n);
  MoeRun dist = run_moe_block(c, *ck, plan, comms, x, T);
  EXPECT_EQ(static_cast<int64_t>(dist.bytes), other_bytes(c, tp) + c.routed_bytes() / n) << name;
  // Rows outside this rank's share carry only the (partial) shared expert: zero without one.
  const int64_t t0 = T * tp_rank / tp, t1 = T * (tp_rank + 1) / tp, H = 16;
  int64_t share_tokens = 0;
  for (int64_t v : dist.stats.expert_tokens) share_tokens += v;
  EXPECT_EQ(share_tokens, (t1 - t0) * k) << name;
  if (S == 0) {
    size_t nonzero = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j)
        if ((t < t0 || t >= t1) && dist.out[t * H + j] != 0.0f) ++nonzero;
    EXPECT_EQ(nonzero, 0u) << name << ": rows outside the share";
  }
  // The decoder's tp sum assembles the whole.
  std::vector<float> sum = dist.out;
  tpc->all_reduce(sum.data(), sum.size(), CommDType::kF32, ReduceOp::kSum);
  MoeRun single = run_moe_block(c, *ck, ShardPlan::make(c.spec), ShardComms{}, x, T);
  if (S == 0) expect_bits(sum, single.out, name + " tp2 ep" + std::to_string(n));
  else expect_close(sum, single.out, 1e-5, name + " tp2 ep" + std::to_string(n));
}

TEST(MoeMpi, TensorTimesDataParallel) {
  check_tp_dp(MoeCase::Kind::kMixtral, 2, 0, {5, 0}, "mixtral-tp2");
  check_tp_dp(MoeCase::Kind::kMixtral, 2, 0, {1, 8}, "mixtral-tp2b");  // a tp rank with an empty share
  check_tp_dp(MoeCase::Kind::kQwen2, 3, 8, {7, 3}, "qwen2-tp2");
  check_tp_dp(MoeCase::Kind::kDeepseek, 3, 8, {0, 6}, "deepseek-tp2");
}

// This rank's tokens for an exchange: T rows of H normal values (T by rank, cycling through
// t_by_rank) and their top-k softmax routing over E experts.
struct RankTokens {
  int64_t T = 0;
  std::vector<float> x;
  Routing routing;
};
RankTokens rank_tokens(const std::vector<int64_t>& t_by_rank, int64_t E, int64_t k, int64_t H, std::mt19937& g) {
  RankTokens t;
  t.T = t_by_rank[static_cast<size_t>(world_rank()) % t_by_rank.size()];
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(t.T * E));
  t.x.resize(static_cast<size_t>(t.T * H));
  for (auto& v : logits) v = nd(g);
  for (auto& v : t.x) v = nd(g);
  route_softmax_topk(logits.data(), t.T, E, k, true, 1.0, &t.routing);
  return t;
}

// ExpertDispatch over a bf16 or fp8 wire (arch/expert_wire.h) against the same dispatch over fp32,
// ep = world, uneven tokens (a rank with none), bit for bit:
//  - the experts' rows are the fp32 rows as the wire carries them, in the same order: rounded to
//    bf16 (torch's rounding, kernels/bf16_bits.h), or quantised per 128 values as the W8A8 GEMMs'
//    activations are (kernels/cpu/fp8_act_quant.h) and read back;
//  - a combine of results equals the fp32 combine of those results rounded to bf16 (fp8 combines
//    in bf16 too).
// Bytes sent: each dispatch record's H floats shrink to the wire's row and its slots (int32) stay;
// the combine's halve exactly.
void check_wire(ExpertWire wire) {
  const int n = world_size(), r = world_rank();
  auto ep = comm_of(all_ranks(), "ep");
  auto cpu = make_backend("cpu");
  const int64_t L = 3, E = L * n, k = 2, H = 24, slots = std::min(k, L);
  std::mt19937 g(40 + static_cast<uint32_t>(r));
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const RankTokens tokens = rank_tokens({7, 0, 12, 3}, E, k, H, g);
  const int64_t T = tokens.T;
  const std::vector<float>& x = tokens.x;
  const Routing& routing = tokens.routing;
  const auto rounded = [](std::vector<float> v) {
    for (auto& f : v) f = bf16_bits::to_f32(bf16_bits::from_f32(f));
    return v;
  };
  const auto quantised = [&](std::vector<float> v) {  // rows of H < 128: a scale per row
    const int64_t m = static_cast<int64_t>(v.size()) / H;
    std::vector<uint8_t> q(v.size());
    std::vector<float> scales(static_cast<size_t>(std::max<int64_t>(m, 1)));
    cpu::fp8_act_quant(v.data(), m, H, q.data(), scales.data(), m);
    for (size_t i = 0; i < v.size(); ++i) v[i] = fp8_bits::to_f32(q[i]) * scales[i / static_cast<size_t>(H)];
    return v;
  };
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  const std::string name = expert_wire_name(wire);

  Scratch s32(*cpu), sw(*cpu);
  ExpertDispatch d32(ep.get(), E, H), dw(ep.get(), E, H);
  d32.dispatch(s32, x.data(), routing, ExpertWire::kF32);
  dw.dispatch(sw, x.data(), routing, wire);
  ASSERT_EQ(dw.offsets(), d32.offsets());
  const int64_t rows = d32.rows();
  const std::vector<float> in32(d32.input().f32, d32.input().f32 + rows * H),
      inw(dw.input().f32, dw.input().f32 + rows * H);
  EXPECT_TRUE(same_bits(inw, wire == ExpertWire::kFp8 ? quantised(in32) : rounded(in32)))
      << "rank " << r << ": the experts' rows are not the " << name << " rows";
  const int64_t records = d32.dispatch_bytes / ((H + slots) * 4);
  EXPECT_EQ(d32.dispatch_bytes, records * (H + slots) * 4);
  const int64_t row_bytes = wire == ExpertWire::kFp8 ? 4 + H : 2 * H;  // fp8: one scale, H codes
  EXPECT_EQ(dw.dispatch_bytes, records * (row_bytes + 4 * slots)) << "rank " << r << " " << name;

  // The experts' results: any values, the same on both.
  std::vector<float> y(static_cast<size_t>(rows * H));
  for (auto& v : y) v = nd(g);
  const std::vector<float> y16 = rounded(y);
  std::copy(y16.begin(), y16.end(), d32.output());
  std::copy(y.begin(), y.end(), dw.output());
  std::vector<float> out32(static_cast<size_t>(T * H), 5.0f), outw(out32.size(), 6.0f);
  d32.combine(s32, out32.data());
  dw.combine(sw, outw.data());
  EXPECT_TRUE(same_bits(outw, out32)) << "rank " << r << ": combine over " << name
                                      << " is not the combine of bf16 results";
  EXPECT_EQ(2 * dw.combine_bytes, d32.combine_bytes) << "rank " << r << " " << name;
  int64_t moved = dw.dispatch_bytes + dw.combine_bytes;
  ep->all_reduce(&moved, 1, CommDType::kI64, ReduceOp::kSum);
  if (n > 1) {
    EXPECT_GT(moved, 0) << "no row crossed ranks";
  }
}

TEST(MoeMpi, Bf16WireRoundsEachRowOnce) { check_wire(ExpertWire::kBf16); }
TEST(MoeMpi, Fp8WireQuantisesEachRowOnce) { check_wire(ExpertWire::kFp8); }

// The CPU backend, but one whose GEMMs would read bf16 twins (as the CUDA backend's do).
class TwinWantingCpu final : public CpuBackend {
 public:
  bool wants_bf16_twins() const override { return true; }
};

// On every wire, the owner's rows come with their bf16 twin where the caller asks for one (up to
// twin_rows rows) and the backend wants twins: the rows' own rounding, written as they come off
// the wire; the rows themselves unchanged by it. None otherwise.
TEST(MoeMpi, ExchangedRowsComeWithTheirTwinWhereAsked) {
  const int n = world_size(), r = world_rank();
  auto ep = comm_of(all_ranks(), "ep");
  const int64_t L = 2, E = L * n, k = 2, H = 200;  // H past one 128-value fp8 group
  std::mt19937 g(70 + static_cast<uint32_t>(r));
  const RankTokens tokens = rank_tokens({9, 4, 0, 13}, E, k, H, g);
  const std::vector<float>& x = tokens.x;
  const Routing& routing = tokens.routing;
  auto cpu = make_backend("cpu");
  TwinWantingCpu twins;
  for (const ExpertWire wire : {ExpertWire::kF32, ExpertWire::kBf16, ExpertWire::kFp8}) {
    const std::string name = expert_wire_name(wire);
    Scratch plain_s(*cpu), twin_s(twins), none_s(twins);
    ExpertDispatch plain(ep.get(), E, H), with_twin(ep.get(), E, H), none(ep.get(), E, H);
    plain.dispatch(plain_s, x.data(), routing, wire, INT64_MAX);  // the CPU wants no twin
    with_twin.dispatch(twin_s, x.data(), routing, wire, INT64_MAX);
    const int64_t rows = plain.rows();
    none.dispatch(none_s, x.data(), routing, wire, rows - 1);  // fewer rows than this rank's
    EXPECT_EQ(plain.input().bf16, nullptr) << name;
    EXPECT_EQ(none.input().bf16, nullptr) << name;
    ASSERT_EQ(with_twin.rows(), rows);
    ASSERT_NE(with_twin.input().bf16, nullptr) << name;
    const float* want = plain.input().f32;
    EXPECT_TRUE(rows == 0 || std::memcmp(with_twin.input().f32, want, static_cast<size_t>(rows * H) * 4) == 0)
        << "rank " << r << " " << name << ": the rows differ with a twin";
    int64_t wrong = 0;
    for (int64_t i = 0; i < rows * H; ++i) wrong += with_twin.input().bf16[i] != bf16_bits::from_f32(want[i]);
    EXPECT_EQ(wrong, 0) << "rank " << r << " " << name << ": twin words that are not the rows' rounding";
  }
}

}  // namespace
