#include "arch/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace shardlm {

namespace {

// Selection key: NaN never wins (it would break the strict ordering).
inline float key(float v) { return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v; }

// The k best of idx (by score, ties lower index first), best first, written to out[0..k).
void top_k(const float* score, std::vector<int32_t>& idx, int64_t k, int32_t* out) {
  auto better = [&](int32_t a, int32_t b) {
    const float sa = key(score[a]), sb = key(score[b]);
    return sa > sb || (sa == sb && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  std::copy_n(idx.begin(), k, out);
}

void prepare(int64_t T, int64_t E, int64_t k, Routing* out) {
  SHARDLM_CHECK(E > 0 && k > 0 && k <= E, "moe routing: top-" << k << " of " << E << " experts");
  SHARDLM_CHECK(T >= 0, "moe routing: " << T << " tokens");
  out->T = T;
  out->k = k;
  out->experts.resize(static_cast<size_t>(T * k));
  out->weights.resize(static_cast<size_t>(T * k));
}

}  // namespace

void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalise, double scale,
                        Routing* out) {
  prepare(T, E, k, out);
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> idx(static_cast<size_t>(E));
  const float fscale = static_cast<float>(scale);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = logits + t * E;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, x[e]);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(x[e] - mx);
      sum += p[e];
    }
    const float fsum = static_cast<float>(sum);
    for (int64_t e = 0; e < E; ++e) p[e] /= fsum;
    std::iota(idx.begin(), idx.end(), 0);
    int32_t* ex = out->experts.data() + t * k;
    float* w = out->weights.data() + t * k;
    top_k(p.data(), idx, k, ex);
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = p[ex[j]];
      chosen += w[j];
    }
    const float fchosen = static_cast<float>(chosen);
    for (int64_t j = 0; j < k; ++j) {
      if (renormalise) w[j] /= fchosen;
      w[j] *= fscale;
    }
  }
}

void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t k, const float* bias, int64_t n_group,
                           int64_t topk_group, bool norm_topk_prob, double routed_scaling_factor, Routing* out) {
  prepare(T, E, k, out);
  SHARDLM_CHECK(n_group >= 1 && E % n_group == 0, "moe routing: n_group " << n_group << " does not divide the "
                                                                           << E << " experts");
  SHARDLM_CHECK(topk_group >= 1 && topk_group <= n_group,
                "moe routing: topk_group " << topk_group << " outside [1, n_group " << n_group << "]");
  const int64_t gsize = E / n_group;
  SHARDLM_CHECK(k <= topk_group * gsize, "moe routing: top-" << k << " exceeds the " << topk_group * gsize
                                                              << " experts of the " << topk_group << " kept groups");
  const bool grouped = topk_group < n_group;
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), gscore(static_cast<size_t>(n_group));
  std::vector<int32_t> gidx(static_cast<size_t>(n_group)), kept(static_cast<size_t>(topk_group)), idx;
  idx.reserve(static_cast<size_t>(E));
  const float fscale = static_cast<float>(routed_scaling_factor);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = logits + t * E;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-x[e]));
      choice[e] = bias ? s[e] + bias[e] : s[e];
    }
    idx.clear();
    if (grouped) {
      // Each group's score: the sum of its two largest biased scores.
      for (int64_t g = 0; g < n_group; ++g) {
        const float* c = choice.data() + g * gsize;
        float a = -std::numeric_limits<float>::infinity(), b = a;  // largest, second largest
        for (int64_t j = 0; j < gsize; ++j) {
          const float v = key(c[j]);
          if (v > a) {
            b = a;
            a = v;
          } else if (v > b) {
            b = v;
          }
        }
        gscore[g] = gsize >= 2 ? a + b : a;
      }
      std::iota(gidx.begin(), gidx.end(), 0);
      top_k(gscore.data(), gidx, topk_group, kept.data());
      std::sort(kept.begin(), kept.end());
      for (int32_t g : kept)
        for (int64_t j = 0; j < gsize; ++j) idx.push_back(static_cast<int32_t>(g * gsize + j));
    } else {
      for (int64_t e = 0; e < E; ++e) idx.push_back(static_cast<int32_t>(e));
    }
    int32_t* ex = out->experts.data() + t * k;
    float* w = out->weights.data() + t * k;
    top_k(choice.data(), idx, k, ex);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = s[ex[j]];
      sum += w[j];
    }
    const float denom = static_cast<float>(sum + 1e-20);
    for (int64_t j = 0; j < k; ++j) {
      if (norm_topk_prob) w[j] /= denom;
      w[j] *= fscale;
    }
  }
}

void route(const MoeSpec& m, const float* logits, int64_t T, const float* bias, Routing* out) {
  if (m.scoring == MoeSpec::Scoring::kSoftmax) {
    const bool renorm = m.norm_topk_prob || m.naming == MoeSpec::Naming::kMixtral;
    route_softmax_topk(logits, T, m.num_experts, m.experts_per_token, renorm, m.routed_scaling_factor, out);
  } else {
    route_sigmoid_grouped(logits, T, m.num_experts, m.experts_per_token, m.score_correction_bias ? bias : nullptr,
                          m.n_group, m.topk_group, m.norm_topk_prob, m.routed_scaling_factor, out);
  }
}

}  // namespace shardlm
