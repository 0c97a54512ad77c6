// The CPU backend's Mixture-of-Experts ops: moe_route against a reference written here in double
// from transformers' routing code (softmax top-k with and without renormalisation, sigmoid
// group-limited with and without bias), and the host code they must reproduce bit for bit:
// expert_permute / expert_gather / expert_combine against
// ExpertDispatch's single-rank path (offsets, gathered rows, combined sum) and against a direct
// reference for a local expert subset [e0, e0 + E), gated_add against the host shared-expert
// epilogue (out += sigmoid(gate) * y, or 1 * y). All comparisons are exact (memcmp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "arch/expert_dispatch.h"
#include "arch/moe_router.h"
#include "compute/backend.h"

using namespace shardlm;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Backend memory for the host vector v (the CPU backend's is host memory, but go through the
// interface as model code does).
template <typename T>
class Buf {
 public:
  Buf(ComputeBackend& b, size_t n) : b_(b), n_(n), p_(static_cast<T*>(b.alloc(std::max<size_t>(n, 1) * sizeof(T)))) {}
  Buf(ComputeBackend& b, const std::vector<T>& v) : Buf(b, v.size()) {
    b_.copy_to_device(p_, v.data(), n_ * sizeof(T));
  }
  ~Buf() { b_.free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    b_.copy_to_host(v.data(), p_, n_ * sizeof(T));
    return v;
  }

 private:
  ComputeBackend& b_;
  size_t n_;
  T* p_;
};

// out[j] += w * y[j], the product rounded before the add: the host form of every combine.
void accumulate(float* out, float w, const float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] += w * y[j];
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
size_t count_differing(const std::vector<T>& a, const std::vector<T>& b) {
  size_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n + std::max(a.size(), b.size()) - std::min(a.size(), b.size());
}

struct RouteCase {
  const char* name;
  RouterConfig cfg;
  bool with_bias;
};

// One token's routing as transformers computes it (MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock:
// softmax, top-k, optional renormalisation; DeepseekV3TopkRouter: sigmoid, bias for the choice
// only, groups scored by their two best, experts of dropped groups excluded, weights from the
// unbiased scores), in double and with a full sort. margin: the smallest gap a choice rested on,
// where float rounding could reorder.
struct ReferenceRoute {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double margin = HUGE_VAL;
};

ReferenceRoute reference_route(const float* x, int64_t E, const RouterConfig& c, const float* bias) {
  ReferenceRoute r;
  std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  if (c.sigmoid) {
    for (int64_t e = 0; e < E; ++e) {
      score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(x[e])));
      choice[e] = score[e] + (bias ? bias[e] : 0.0);
    }
  } else {
    double mx = -HUGE_VAL, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(x[e]));
    for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - mx);
    for (int64_t e = 0; e < E; ++e) choice[e] = score[e] = std::exp(x[e] - mx) / sum;
  }
  // Sorted best first, ties to the lower index; the gap at position k.
  auto best_first = [&](std::vector<int32_t> idx, const std::vector<double>& by, size_t k) {
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return by[a] > by[b]; });
    if (k < idx.size()) r.margin = std::min(r.margin, by[idx[k - 1]] - by[idx[k]]);
    idx.resize(k);
    return idx;
  };
  std::vector<int32_t> candidates;
  const int64_t groups = c.sigmoid ? c.n_group : 1, per_group = E / groups;
  if (groups > 1 && c.topk_group < groups) {
    std::vector<double> group_score(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::sort(members.rbegin(), members.rend());
      group_score[g] = members[0] + (per_group > 1 ? members[1] : 0.0);
    }
    std::vector<int32_t> all_groups(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) all_groups[g] = static_cast<int32_t>(g);
    for (int32_t g : best_first(all_groups, group_score, static_cast<size_t>(c.topk_group)))
      for (int64_t j = 0; j < per_group; ++j) candidates.push_back(static_cast<int32_t>(g * per_group + j));
  } else {
    for (int64_t e = 0; e < E; ++e) candidates.push_back(static_cast<int32_t>(e));
  }
  r.ids = best_first(candidates, choice, static_cast<size_t>(c.k));
  double sum = 0;
  for (int32_t e : r.ids) sum += score[e];
  const bool normalise = c.sigmoid ? c.norm_topk_prob : c.renormalise;
  for (int32_t e : r.ids) r.weights.push_back((normalise ? score[e] / sum : score[e]) * c.scale);
  return r;
}

TEST(CpuMoeOps, MoeRouteMatchesAReferenceInDouble) {
  auto b = make_backend("cpu");
  const int64_t T = 41, E = 16;
  const auto logits = randn(static_cast<size_t>(T * E), 1, 2.0f);
  const auto bias = randn(static_cast<size_t>(E), 2, 0.1f);
  Buf<float> d_logits(*b, logits), d_bias(*b, bias);

  auto cfg = [](bool sigmoid, int64_t k, bool renorm, bool norm, double scale, int64_t groups, int64_t kept) {
    RouterConfig c;
    c.num_experts = 16;
    c.k = k;
    c.sigmoid = sigmoid;
    c.renormalise = renorm;
    c.norm_topk_prob = norm;
    c.scale = scale;
    c.n_group = groups;
    c.topk_group = kept;
    return c;
  };
  const RouteCase cases[] = {
      {"softmax renormalised", cfg(false, 2, true, false, 1.0, 1, 1), false},
      {"softmax plain", cfg(false, 4, false, false, 1.0, 1, 1), false},
      {"softmax scaled", cfg(false, 4, true, false, 2.5, 1, 1), false},
      {"sigmoid grouped, bias", cfg(true, 4, false, true, 2.5, 4, 2), true},
      {"sigmoid grouped, no bias, unnormalised", cfg(true, 3, false, false, 1.0, 8, 3), false},
      {"sigmoid ungrouped, bias", cfg(true, 6, false, true, 1.5, 1, 1), true},
  };
  for (const RouteCase& rc : cases) {
    RouterConfig c = rc.cfg;
    c.bias = rc.with_bias ? d_bias.get() : nullptr;
    const int64_t k = c.k;
    Buf<int32_t> ids(*b, static_cast<size_t>(T * k));
    Buf<float> w(*b, static_cast<size_t>(T * k));
    b->moe_route(d_logits.get(), T, c, ids.get(), w.get());
    const std::vector<int32_t> got_ids = ids.host();
    const std::vector<float> got_w = w.host();
    int64_t compared = 0;
    for (int64_t t = 0; t < T; ++t) {
      const ReferenceRoute ref = reference_route(logits.data() + t * E, E, c, rc.with_bias ? bias.data() : nullptr);
      if (ref.margin < 1e-5) continue;  // a near tie float may break either way
      ++compared;
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(got_ids[t * k + j], ref.ids[j]) << rc.name << ": token " << t << " choice " << j;
        EXPECT_NEAR(got_w[t * k + j], ref.weights[j], 2e-6 * std::max(1.0, std::abs(ref.weights[j])))
            << rc.name << ": token " << t << " choice " << j;
      }
    }
    EXPECT_GE(compared, T - 3) << rc.name << ": too many near ties to be a test";
  }

  // No tokens: nothing written.
  Buf<int32_t> ids(*b, 4);
  b->copy_to_device(ids.get(), std::vector<int32_t>(4, -7).data(), 4 * sizeof(int32_t));
  Buf<float> w(*b, 4);
  b->moe_route(d_logits.get(), 0, cfg(false, 2, true, false, 1.0, 1, 1), ids.get(), w.get());
  EXPECT_EQ(ids.host(), std::vector<int32_t>(4, -7));
  // Invalid configurations are refused like the router refuses them.
  EXPECT_ANY_THROW(b->moe_route(d_logits.get(), T, cfg(false, 17, true, false, 1.0, 1, 1), ids.get(), w.get()));
  EXPECT_ANY_THROW(b->moe_route(d_logits.get(), T, cfg(true, 2, false, true, 1.0, 3, 1), ids.get(), w.get()));
}

// All experts local: the ops reproduce ExpertDispatch(nullptr)'s offsets, gathered rows and combine.
TEST(CpuMoeOps, PermuteGatherCombineMatchTheHostDispatch) {
  auto b = make_backend("cpu");
  for (const int64_t T : {int64_t{1}, int64_t{37}}) {
    const int64_t E = 8, k = 3, H = 24, P = T * k;
    const auto logits = randn(static_cast<size_t>(T * E), 3 + static_cast<uint32_t>(T));
    Routing r;
    route_softmax_topk(logits.data(), T, E, k, true, 1.0, &r);
    const auto x = randn(static_cast<size_t>(T * H), 4);

    Scratch scratch(*b);  // the CPU backend's memory is host memory: d's buffers are read directly
    ExpertDispatch d(nullptr, E, H);
    d.dispatch(scratch, x.data(), r);
    ASSERT_EQ(d.rows(), P);

    Buf<int32_t> ids(*b, r.experts), offsets(*b, static_cast<size_t>(E + 1)), slot_row(*b, static_cast<size_t>(P)),
        row_pair(*b, static_cast<size_t>(P));
    Buf<float> w(*b, r.weights), dx(*b, x), xp(*b, static_cast<size_t>(P * H));
    b->expert_permute(ids.get(), T, k, 0, E, nullptr, offsets.get(), slot_row.get(), row_pair.get(), nullptr);
    const auto off = offsets.host();
    ASSERT_EQ(static_cast<int64_t>(off.size()), E + 1);
    for (int64_t e = 0; e <= E; ++e) EXPECT_EQ(off[e], d.offsets()[e]) << "T " << T << " offset " << e;

    // The row maps are inverse to each other and every row's pair belongs to its expert.
    const auto sr = slot_row.host(), rp = row_pair.host();
    for (int64_t i = 0; i < P; ++i) {
      ASSERT_GE(sr[i], 0);
      ASSERT_EQ(rp[sr[i]], i);
      const int32_t e = r.experts[i];
      EXPECT_TRUE(sr[i] >= off[e] && sr[i] < off[e + 1]) << "pair " << i;
    }

    b->expert_gather(dx.get(), H, k, row_pair.get(), offsets.get() + E, P, xp.get());
    const std::vector<float> want_xp(d.input().f32, d.input().f32 + P * H);
    EXPECT_TRUE(same_bits(xp.host(), want_xp)) << "T " << T << ": " << count_differing(xp.host(), want_xp)
                                               << " gathered values differ";

    // The experts' results: any values, the same in both layouts (the rows correspond).
    const auto y = randn(static_cast<size_t>(P * H), 5);
    std::copy(y.begin(), y.end(), d.output());
    std::vector<float> want(static_cast<size_t>(T * H));
    d.combine(scratch, want.data());
    Buf<float> yp(*b, y), out(*b, static_cast<size_t>(T * H));
    b->copy_to_device(out.get(), randn(static_cast<size_t>(T * H), 6).data(), static_cast<size_t>(T * H) * 4);
    b->expert_combine(yp.get(), H, ids.get(), w.get(), slot_row.get(), T, k, out.get());
    const auto got = out.host();
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::abs(double(got[i]) - want[i]));
    EXPECT_TRUE(same_bits(got, want)) << "T " << T << ": " << count_differing(got, want)
                                      << " combined values differ, max |diff| " << max_diff;
  }
}

// A local subset of the experts (an expert-parallel rank's): pairs of other experts get no row,
// the combine sums the local ones in ascending expert id, tokens with none get zeros.
TEST(CpuMoeOps, LocalExpertSubset) {
  auto b = make_backend("cpu");
  const int64_t T = 23, Eall = 8, k = 2, H = 16, e0 = 3, E = 3;
  const auto logits = randn(static_cast<size_t>(T * Eall), 7);
  Routing r;
  route_softmax_topk(logits.data(), T, Eall, k, false, 1.0, &r);
  const auto x = randn(static_cast<size_t>(T * H), 8);
  const int64_t P = T * k;
  Buf<int32_t> ids(*b, r.experts), offsets(*b, static_cast<size_t>(E + 1)), slot_row(*b, static_cast<size_t>(P)),
      row_pair(*b, static_cast<size_t>(P));
  b->expert_permute(ids.get(), T, k, e0, E, nullptr, offsets.get(), slot_row.get(), row_pair.get(), nullptr);
  const auto off = offsets.host(), sr = slot_row.host(), rp = row_pair.host();

  // Expected rows: local pairs in (expert, pair) order.
  std::vector<int32_t> want_off(static_cast<size_t>(E + 1), 0), want_rp;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < P; ++i)
      if (r.experts[i] == e0 + e) want_rp.push_back(static_cast<int32_t>(i));
    want_off[e + 1] = static_cast<int32_t>(want_rp.size());
  }
  EXPECT_EQ(off, want_off);
  const int64_t rows = want_off[E];
  ASSERT_GT(rows, 0);
  ASSERT_LT(rows, P);
  EXPECT_EQ(std::vector<int32_t>(rp.begin(), rp.begin() + rows), want_rp);
  for (int64_t i = 0; i < P; ++i) {
    const bool local = r.experts[i] >= e0 && r.experts[i] < e0 + E;
    if (local)
      EXPECT_EQ(rp[sr[i]], i);
    else
      EXPECT_EQ(sr[i], -1) << "pair " << i;
  }

  Buf<float> dx(*b, x), xp(*b, static_cast<size_t>(rows * H));
  b->expert_gather(dx.get(), H, k, row_pair.get(), offsets.get() + E, P, xp.get());
  const auto gx = xp.host();
  for (int64_t row = 0; row < rows; ++row)
    ASSERT_EQ(std::memcmp(&gx[row * H], &x[(want_rp[row] / k) * H], H * sizeof(float)), 0) << "row " << row;

  const auto y = randn(static_cast<size_t>(rows * H), 9);
  Buf<float> yp(*b, y), w(*b, r.weights), out(*b, static_cast<size_t>(T * H));
  b->expert_combine(yp.get(), H, ids.get(), w.get(), slot_row.get(), T, k, out.get());
  std::vector<float> want(static_cast<size_t>(T * H), 0.0f);
  int64_t empty_tokens = 0;
  for (int64_t t = 0; t < T; ++t) {
    int64_t n = 0;
    for (int64_t e = e0; e < e0 + E; ++e)
      for (int64_t j = 0; j < k; ++j)
        if (r.experts[t * k + j] == e) {
          accumulate(&want[t * H], r.weights[t * k + j], &y[sr[t * k + j] * H], H);
          ++n;
        }
    empty_tokens += n == 0;
  }
  EXPECT_GT(empty_tokens, 0);
  EXPECT_TRUE(same_bits(out.host(), want)) << count_differing(out.host(), want) << " values differ";
}

// gated_add is the host shared-expert epilogue: out += sigmoid(g_t) * y (or 1 * y).
TEST(CpuMoeOps, GatedAddMatchesTheHostEpilogue) {
  auto b = make_backend("cpu");
  const int64_t T = 13, H = 40;
  const auto out0 = randn(static_cast<size_t>(T * H), 10), y = randn(static_cast<size_t>(T * H), 11),
             g = randn(static_cast<size_t>(T), 12, 3.0f);
  for (const bool gated : {true, false}) {
    Buf<float> out(*b, out0), dy(*b, y), dg(*b, g);
    b->gated_add(out.get(), dy.get(), gated ? dg.get() : nullptr, T, H);
    std::vector<float> want = out0;
    for (int64_t t = 0; t < T; ++t) {
      const float gt = gated ? 1.0f / (1.0f + std::exp(-g[t])) : 1.0f;
      accumulate(&want[t * H], gt, &y[t * H], H);
    }
    EXPECT_TRUE(same_bits(out.host(), want)) << (gated ? "gated" : "ungated") << ": "
                                             << count_differing(out.host(), want) << " values differ";
  }
  // Nothing to do for no tokens.
  Buf<float> out(*b, out0), dy(*b, y);
  b->gated_add(out.get(), dy.get(), nullptr, 0, H);
  EXPECT_TRUE(same_bits(out.host(), out0));
}

}  // namespace
