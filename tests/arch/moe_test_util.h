// A tiny random MoE layer for tests: the ModelSpec (filled by hand), a one-layer safetensors
// checkpoint under the naming being tested, the exact float values of its weights, and a naive
// double-precision reference of the layer's output.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "arch/layer_blocks.h"
#include "arch/scratch.h"
#include "arch/shard_plan.h"
#include "arch/weight_loader.h"
#include "compute/backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"
#include "model/safetensors.h"

namespace shardlm::test {

// Deterministic value in [-1, 1) from a seed and an index.
inline float moe_rand(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

struct MoeCase {
  enum class Kind { kMixtral, kQwen2, kQwen3, kDeepseek };
  ModelSpec spec;
  int64_t layer = 1;
  // Exact values of the stored weights (bf16 ones rounded).
  std::map<std::string, std::vector<float>> w;
  std::string router, bias, shared_gate, expert_prefix, gate, up, down, shared_prefix;

  // H hidden, E experts of intermediate I, top-k; shared S (0: none, ignored for Mixtral).
  MoeCase(Kind kind, int64_t H, int64_t E, int64_t I, int64_t k, int64_t S = 0) {
    spec.hidden_size = H;
    spec.num_layers = layer + 1;
    spec.num_heads = spec.num_kv_heads = 4;  // unused by the block; ShardPlan::make wants them divisible
    spec.intermediate_size = 8;
    spec.vocab_size = 16;
    MoeSpec& m = spec.moe;
    m.num_experts = E;
    m.experts_per_token = k;
    m.expert_intermediate = I;
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    switch (kind) {
      case Kind::kMixtral:
        m.naming = MoeSpec::Naming::kMixtral;
        m.norm_topk_prob = false;  // Mixtral renormalises anyway
        router = p + "block_sparse_moe.gate.weight";
        expert_prefix = p + "block_sparse_moe.experts.";
        gate = ".w1.weight", up = ".w3.weight", down = ".w2.weight";
        break;
      case Kind::kQwen2:
      case Kind::kQwen3:
        m.naming = MoeSpec::Naming::kQwen;
        m.norm_topk_prob = kind == Kind::kQwen3;
        router = p + "mlp.gate.weight";
        expert_prefix = p + "mlp.experts.";
        gate = ".gate_proj.weight", up = ".up_proj.weight", down = ".down_proj.weight";
        if (kind == Kind::kQwen2 && S > 0) {
          m.shared_intermediate = S;
          m.shared_expert_gate = true;
          shared_prefix = p + "mlp.shared_expert.";
          shared_gate = p + "mlp.shared_expert_gate.weight";
        }
        break;
      case Kind::kDeepseek:
        m.naming = MoeSpec::Naming::kDeepseek;
        m.scoring = MoeSpec::Scoring::kSigmoid;
        m.score_correction_bias = true;
        m.norm_topk_prob = true;
        m.n_group = E >= 8 ? 4 : 1;
        m.topk_group = E >= 8 ? 2 : 1;
        m.routed_scaling_factor = 2.5;
        router = p + "mlp.gate.weight";
        bias = p + "mlp.gate.e_score_correction_bias";
        expert_prefix = p + "mlp.experts.";
        gate = ".gate_proj.weight", up = ".up_proj.weight", down = ".down_proj.weight";
        if (S > 0) {
          m.shared_intermediate = S;
          shared_prefix = p + "mlp.shared_experts.";
        }
        break;
    }
  }

  const MoeSpec& moe() const { return spec.moe; }

  // Writes DIR/model.safetensors: the router in `router_dtype`, everything else in bf16 (the
  // correction bias in f32), values from `seed`.
  void write(const std::filesystem::path& dir, uint64_t seed, DType router_dtype = DType::F32) {
    const int64_t H = spec.hidden_size, E = moe().num_experts, I = moe().expert_intermediate,
                  S = moe().shared_intermediate;
    struct Item {
      std::string name;
      DType dt;
      std::vector<int64_t> shape;
      float scale;
    };
    std::vector<Item> items;
    items.push_back({router, router_dtype, {E, H}, 1.0f});
    if (!bias.empty()) items.push_back({bias, DType::F32, {E}, 0.1f});
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = expert_prefix + std::to_string(e);
      items.push_back({ep + gate, DType::BF16, {I, H}, 0.5f});
      items.push_back({ep + up, DType::BF16, {I, H}, 0.5f});
      items.push_back({ep + down, DType::BF16, {H, I}, 0.5f});
    }
    if (S > 0) {
      items.push_back({shared_prefix + "gate_proj.weight", DType::BF16, {S, H}, 0.5f});
      items.push_back({shared_prefix + "up_proj.weight", DType::BF16, {S, H}, 0.5f});
      items.push_back({shared_prefix + "down_proj.weight", DType::BF16, {H, S}, 0.5f});
      if (!shared_gate.empty()) items.push_back({shared_gate, DType::BF16, {1, H}, 0.5f});
    }
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<SafetensorsWriteItem> out;
    uint64_t salt = 0;
    for (const Item& it : items) {
      int64_t n = 1;
      for (int64_t d : it.shape) n *= d;
      std::vector<float>& vals = w[it.name];
      vals.resize(static_cast<size_t>(n));
      bytes.emplace_back(static_cast<size_t>(n) * dtype_size(it.dt));
      ++salt;
      for (int64_t i = 0; i < n; ++i) {
        const float v = moe_rand(seed * 1000 + salt, static_cast<uint64_t>(i)) * it.scale;
        if (it.dt == DType::BF16) {
          const uint16_t b = f32_to_bf16(v);
          vals[i] = bf16_to_f32(b);
          std::memcpy(bytes.back().data() + i * 2, &b, 2);
        } else {
          vals[i] = v;
          std::memcpy(bytes.back().data() + i * 4, &v, 4);
        }
      }
      out.push_back({it.name, it.dt, it.shape, bytes.back().data()});
    }
    std::filesystem::create_directories(dir);
    write_safetensors((dir / "model.safetensors").string(), out);
  }

  // Checkpoint bytes of the routed experts (bf16).
  int64_t routed_bytes() const {
    return moe().num_experts * 3 * moe().expert_intermediate * spec.hidden_size * 2;
  }

  // Naive reference: out [T, H] in double for hidden rows x [T, H].
  std::vector<double> reference(const std::vector<float>& x, int64_t T) const {
    const MoeSpec& m = moe();
    const int64_t H = spec.hidden_size, E = m.num_experts, I = m.expert_intermediate, k = m.experts_per_token,
                  S = m.shared_intermediate;
    auto silu = [](double v) { return v / (1 + std::exp(-v)); };
    // y = down(silu(gate x) * up x)
    auto mlp = [&](const std::string& g, const std::string& u, const std::string& d, int64_t inter,
                   const float* xr, std::vector<double>& y) {
      const auto& G = w.at(g);
      const auto& U = w.at(u);
      const auto& D = w.at(d);
      std::vector<double> a(static_cast<size_t>(inter));
      for (int64_t i = 0; i < inter; ++i) {
        double gs = 0, us = 0;
        for (int64_t j = 0; j < H; ++j) {
          gs += static_cast<double>(G[i * H + j]) * xr[j];
          us += static_cast<double>(U[i * H + j]) * xr[j];
        }
        a[i] = silu(gs) * us;
      }
      y.assign(static_cast<size_t>(H), 0.0);
      for (int64_t o = 0; o < H; ++o)
        for (int64_t i = 0; i < inter; ++i) y[o] += static_cast<double>(D[o * inter + i]) * a[i];
    };
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    const auto& R = w.at(router);
    std::vector<double> logit(static_cast<size_t>(E)), score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    std::vector<double> y;
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x.data() + t * H;
      for (int64_t e = 0; e < E; ++e) {
        double s = 0;
        for (int64_t j = 0; j < H; ++j) s += static_cast<double>(R[e * H + j]) * xr[j];
        logit[e] = s;
      }
      std::vector<int> chosen;
      std::vector<double> wts;
      if (m.scoring == MoeSpec::Scoring::kSoftmax) {
        const double mx = *std::max_element(logit.begin(), logit.end());
        double z = 0;
        for (int64_t e = 0; e < E; ++e) z += (score[e] = std::exp(logit[e] - mx));
        for (double& s : score) s /= z;
        choice = score;
      } else {
        for (int64_t e = 0; e < E; ++e) {
          score[e] = 1 / (1 + std::exp(-logit[e]));
          choice[e] = score[e] + (bias.empty() ? 0.0 : w.at(bias)[e]);
        }
        const int64_t gs = E / m.n_group;
        std::vector<double> gscore(static_cast<size_t>(m.n_group));
        for (int64_t g = 0; g < m.n_group; ++g) {
          std::vector<double> c(choice.begin() + g * gs, choice.begin() + (g + 1) * gs);
          std::sort(c.rbegin(), c.rend());
          gscore[g] = c[0] + (gs > 1 ? c[1] : 0.0);
        }
        std::vector<int> gi(static_cast<size_t>(m.n_group));
        std::iota(gi.begin(), gi.end(), 0);
        std::stable_sort(gi.begin(), gi.end(), [&](int a, int b) { return gscore[a] > gscore[b]; });
        for (int64_t r = m.topk_group; r < m.n_group; ++r)
          for (int64_t j = 0; j < gs; ++j) choice[gi[r] * gs + j] = -1e300;
      }
      std::vector<int> ei(static_cast<size_t>(E));
      std::iota(ei.begin(), ei.end(), 0);
      std::stable_sort(ei.begin(), ei.end(), [&](int a, int b) { return choice[a] > choice[b]; });
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        chosen.push_back(ei[j]);
        wts.push_back(score[ei[j]]);
        sum += score[ei[j]];
      }
      const bool norm = m.norm_topk_prob || m.naming == MoeSpec::Naming::kMixtral;
      for (double& v : wts) v = (norm ? v / sum : v) * m.routed_scaling_factor;
      for (int64_t j = 0; j < k; ++j) {
        const std::string ep = expert_prefix + std::to_string(chosen[j]);
        mlp(ep + gate, ep + up, ep + down, I, xr, y);
        for (int64_t o = 0; o < H; ++o) out[t * H + o] += wts[j] * y[o];
      }
      if (S > 0) {
        mlp(shared_prefix + "gate_proj.weight", shared_prefix + "up_proj.weight", shared_prefix + "down_proj.weight",
            S, xr, y);
        double g = 1;
        if (!shared_gate.empty()) {
          double s = 0;
          for (int64_t j = 0; j < H; ++j) s += static_cast<double>(w.at(shared_gate)[j]) * xr[j];
          g = 1 / (1 + std::exp(-s));
        }
        for (int64_t o = 0; o < H; ++o) out[t * H + o] += g * y[o];
      }
    }
    return out;
  }
};

// Hidden rows for tests: T rows of H values.
inline std::vector<float> moe_hidden(uint64_t seed, int64_t T, int64_t H) {
  std::vector<float> x(static_cast<size_t>(T * H));
  for (size_t i = 0; i < x.size(); ++i) x[i] = moe_rand(seed, i);
  return x;
}

// One block built for `plan` (and `comms`) and run once on x [T, H]: its output, statistics and
// the checkpoint bytes it loaded.
struct MoeRun {
  std::vector<float> out;
  MoeStepStats stats;
  size_t bytes = 0;
};

inline MoeRun run_moe_block(const MoeCase& c, const Checkpoint& ck, const ShardPlan& plan, const ShardComms& comms,
                            const std::vector<float>& x, int64_t T) {
  auto b = make_backend("cpu");
  MoeRun r;
  r.stats.reset(c.moe().num_experts);
  WeightLoader w(ck, *b);
  auto blk = make_moe_block(c.spec, plan, c.layer, w, comms, &r.stats);
  r.bytes = w.bytes();
  Scratch s(*b);
  const int64_t H = c.spec.hidden_size;
  const size_t n = static_cast<size_t>(std::max<int64_t>(T, 1) * H);
  float* h = static_cast<float*>(b->alloc(n * sizeof(float)));
  float* out = static_cast<float*>(b->alloc(n * sizeof(float)));
  b->copy_to_device(h, x.data(), static_cast<size_t>(T * H) * sizeof(float));
  StepContext ctx;
  ctx.T = T;
  blk->forward(h, ctx, s, out);
  r.out.resize(static_cast<size_t>(T * H));
  b->copy_to_host(r.out.data(), out, r.out.size() * sizeof(float));
  b->free(h);
  b->free(out);
  return r;
}

// One parameterised MoE block case: a name for the test, the layer's kind and sizes (experts,
// expert intermediate, top-k, shared intermediate) and the router weight's dtype.
struct MoeParam {
  const char* name;
  MoeCase::Kind kind;
  int64_t E, I, k, S;
  DType router_dtype;
};

inline void PrintTo(const MoeParam& p, std::ostream* os) { *os << p.name; }

}  // namespace shardlm::test
