// The MLA attention block (make_mla_attention) on tiny random checkpoints against a naive
// non-absorbed reference written here in double: per head, k_nope and v are expanded from
// kv_b_proj, rope is applied the way older transformers did it (de-interleave, then rotate_half),
// and every position attends to the whole causal prefix. Covered: q_lora_rank 0 and > 0, YaRN
// (frequencies, attention factor, softmax mscale), interleaved and rotate-half layouts, f32 and
// bf16 and fp8 block-scaled weights, biases, several sequences of different lengths per step, prefill chunks then
// decode tokens reading the paged cache, tp 2 partial outputs summing to the tp 1 output, and a
// token's bits not depending on the rest of the step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "arch/layer_blocks.h"
#include "arch/rope_freqs.h"
#include "arch/scratch.h"
#include "arch/shard_plan.h"
#include "arch/weight_loader.h"
#include "compute/cpu_backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"
#include "model/safetensors.h"
#include "model/test_util.h"

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <ostream>

using namespace shardlm;

namespace {

struct Variant {
  const char* name;
  int64_t q_lora;
  bool interleave;
  bool yarn;
  bool bf16;
  bool bias;
  bool fp8 = false;  // matrices stored as F8_E4M3 with 128x128 block scales (DeepSeek-V3's format)
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

constexpr int64_t kLayer = 1;  // the block reads layer 1's tensors (layer 0 holds decoys)

ModelSpec make_spec(const Variant& v) {
  ModelSpec s;
  s.architecture = "DeepseekV3ForCausalLM";
  s.model_type = "deepseek_v3";
  s.hidden_size = 40;
  s.intermediate_size = 32;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = 4;
  s.head_dim = 8;
  s.vocab_size = 64;
  s.max_position_embeddings = 4096;
  s.rms_norm_eps = 1e-5;  // the latent norms use 1e-6 regardless (as transformers does)
  s.rope_theta = 10000;
  s.attention_bias = v.bias;
  s.o_proj_bias = v.bias;
  if (v.yarn) {
    // Ramp bounds 1 and 3 over the 4 frequencies: kept, kept, blended, interpolated.
    s.rope_scaling.kind = RopeScaling::Kind::kYarn;
    s.rope_scaling.factor = 4;
    s.rope_scaling.original_max_position_embeddings = 4096;
    s.rope_scaling.mscale = 0.707;
    s.rope_scaling.mscale_all_dim = 1.0;  // attention factor != 1 and a softmax correction
  }
  s.mla.q_lora_rank = v.q_lora;
  s.mla.kv_lora_rank = 32;
  s.mla.qk_nope_head_dim = 16;
  s.mla.qk_rope_head_dim = 8;
  s.mla.v_head_dim = 12;
  s.mla.rope_interleave = v.interleave;
  return s;
}

// The layer's weights as the reference sees them (already rounded to bf16 when stored so),
// written to DIR/model.safetensors.
struct TinyWeights {
  std::map<std::string, std::vector<float>> t;
  const std::vector<float>& operator[](const std::string& n) const { return t.at(n); }
  bool has(const std::string& n) const { return t.count(n) != 0; }
};

TinyWeights write_checkpoint(const ModelSpec& s, bool bf16, const std::string& dir, bool fp8 = false) {
  const int64_t H = s.hidden_size, NH = s.num_heads, Q = s.mla.q_lora_rank, L = s.mla.kv_lora_rank;
  const int64_t dr = s.mla.qk_rope_head_dim, qk = s.mla.qk_head_dim(), dn = s.mla.qk_nope_head_dim,
                dv = s.mla.v_head_dim;
  std::mt19937 rng(1234 + static_cast<uint32_t>(Q) + (bf16 ? 7 : 0));
  struct Decl {
    std::string name;
    std::vector<int64_t> shape;
    float lo, hi;
  };
  std::vector<Decl> decls;
  auto mat = [&](const std::string& n, int64_t r, int64_t c) {
    const float a = 1.6f / std::sqrt(static_cast<float>(c));
    decls.push_back({n, {r, c}, -a, a});
  };
  auto vec = [&](const std::string& n, int64_t len, float lo, float hi) { decls.push_back({n, {len}, lo, hi}); };
  for (int64_t l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    if (Q > 0) {
      mat(p + "q_a_proj.weight", Q, H);
      vec(p + "q_a_layernorm.weight", Q, 0.5f, 1.5f);
      mat(p + "q_b_proj.weight", NH * qk, Q);
      if (s.attention_bias) vec(p + "q_a_proj.bias", Q, -0.2f, 0.2f);
    } else {
      mat(p + "q_proj.weight", NH * qk, H);
    }
    mat(p + "kv_a_proj_with_mqa.weight", L + dr, H);
    vec(p + "kv_a_layernorm.weight", L, 0.5f, 1.5f);
    mat(p + "kv_b_proj.weight", NH * (dn + dv), L);
    mat(p + "o_proj.weight", H, NH * dv);
    if (s.attention_bias) vec(p + "kv_a_proj_with_mqa.bias", L + dr, -0.2f, 0.2f);
    if (s.o_proj_bias) vec(p + "o_proj.bias", H, -0.2f, 0.2f);
  }
  TinyWeights w;
  std::vector<std::vector<uint16_t>> bf_store;
  std::vector<std::vector<uint8_t>> q_store;
  std::vector<std::vector<float>> scale_store;
  std::vector<SafetensorsWriteItem> items;
  for (const Decl& d : decls) {
    int64_t n = 1;
    for (int64_t e : d.shape) n *= e;
    std::uniform_real_distribution<float> U(d.lo, d.hi);
    std::vector<float>& v = w.t[d.name];
    v.resize(n);
    for (auto& e : v) e = U(rng);
    if (fp8 && d.shape.size() == 2) {
      // The reference sees the loader's dequantisation: bf16(fp8 * block scale).
      const int64_t R = d.shape[0], C = d.shape[1], sr = (R + 127) / 128, sc = (C + 127) / 128;
      q_store.emplace_back(n);
      scale_store.emplace_back(sr * sc);
      quantize_fp8_block(v.data(), R, C, 128, 128, q_store.back().data(), scale_store.back().data());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          v[r * C + c] = bf16_to_f32(f32_to_bf16(fp8_e4m3_to_f32(q_store.back()[r * C + c]) *
                                                 scale_store.back()[(r / 128) * sc + c / 128]));
      items.push_back({d.name, DType::F8_E4M3, d.shape, q_store.back().data()});
      items.push_back({d.name + "_scale_inv", DType::F32, {sr, sc}, scale_store.back().data()});
    } else if (bf16) {
      bf_store.emplace_back(n);
      for (int64_t i = 0; i < n; ++i) {
        bf_store.back()[i] = f32_to_bf16(v[i]);
        v[i] = bf16_to_f32(bf_store.back()[i]);
      }
      items.push_back({d.name, DType::BF16, d.shape, bf_store.back().data()});
    } else {
      items.push_back({d.name, DType::F32, d.shape, v.data()});
    }
  }
  write_safetensors(dir + "/model.safetensors", items);
  return w;
}

// ---- reference ----

std::vector<double> matvec(const std::vector<float>& W, int64_t rows, int64_t cols, const double* x,
                           const std::vector<float>* bias = nullptr, int64_t r0 = 0, int64_t nr = -1) {
  if (nr < 0) nr = rows;
  std::vector<double> y(nr, 0.0);
  for (int64_t r = 0; r < nr; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(W[(r0 + r) * cols + c]) * x[c];
    y[r] = acc + (bias ? (*bias)[r0 + r] : 0.0);
  }
  return y;
}

std::vector<double> rms(const std::vector<double>& x, const std::vector<float>& g, double eps) {
  double ss = 0;
  for (double e : x) ss += e * e;
  const double r = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = g[i] * (x[i] * r);
  return y;
}

// transformers' rope for DeepSeek as its older code wrote it: for the interleaved layout, first
// view(d/2, 2).transpose.reshape (evens then odds), then x*cos + rotate_half(x)*sin with
// cos/sin = cat(freqs, freqs).cos()/sin() * attention_factor.
std::vector<double> ref_rope(const double* x, int64_t d, int64_t pos, const std::vector<float>& inv, double af,
                             bool interleave) {
  std::vector<double> u(d);
  for (int64_t i = 0; i < d; ++i) u[i] = interleave ? (i < d / 2 ? x[2 * i] : x[2 * (i - d / 2) + 1]) : x[i];
  std::vector<double> y(d);
  for (int64_t i = 0; i < d; ++i) {
    const double f = static_cast<double>(pos) * inv[i % (d / 2)];
    const double rot = i < d / 2 ? -u[i + d / 2] : u[i - d / 2];
    y[i] = u[i] * std::cos(f) * af + rot * std::sin(f) * af;
  }
  return y;
}

// out[p] for every position p of a sequence of hidden states X [len, H], tp 1.
std::vector<std::vector<double>> reference(const ModelSpec& s, const TinyWeights& w,
                                           const std::vector<std::vector<double>>& X) {
  const int64_t H = s.hidden_size, NH = s.num_heads, Q = s.mla.q_lora_rank, L = s.mla.kv_lora_rank;
  const int64_t dr = s.mla.qk_rope_head_dim, dn = s.mla.qk_nope_head_dim, dv = s.mla.v_head_dim, qk = dn + dr;
  const std::string p = "model.layers." + std::to_string(kLayer) + ".self_attn.";
  auto opt = [&](const std::string& n) { return w.has(n) ? &w[n] : nullptr; };
  const std::vector<float> inv = rope_inv_freq(s, dr);
  double af = 1.0, scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (s.rope_scaling.kind == RopeScaling::Kind::kYarn) {
    const auto& rs = s.rope_scaling;
    auto ms = [](double f, double m) { return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0; };
    af = ms(rs.factor, rs.mscale) / ms(rs.factor, rs.mscale_all_dim);
    scale *= ms(rs.factor, rs.mscale_all_dim) * ms(rs.factor, rs.mscale_all_dim);
  }
  const int64_t len = static_cast<int64_t>(X.size());
  // Per position: q [NH, qk] (roped), k [NH, qk] (k_nope expanded + shared roped k), v [NH, dv].
  std::vector<std::vector<double>> q(len), k(len), v(len);
  for (int64_t t = 0; t < len; ++t) {
    std::vector<double> qs;
    if (Q > 0) {
      auto qa = rms(matvec(w[p + "q_a_proj.weight"], Q, H, X[t].data(), opt(p + "q_a_proj.bias")),
                    w[p + "q_a_layernorm.weight"], 1e-6);
      qs = matvec(w[p + "q_b_proj.weight"], NH * qk, Q, qa.data());
    } else {
      qs = matvec(w[p + "q_proj.weight"], NH * qk, H, X[t].data());
    }
    auto kv = matvec(w[p + "kv_a_proj_with_mqa.weight"], L + dr, H, X[t].data(), opt(p + "kv_a_proj_with_mqa.bias"));
    auto lat = rms(std::vector<double>(kv.begin(), kv.begin() + L), w[p + "kv_a_layernorm.weight"], 1e-6);
    auto kr = ref_rope(kv.data() + L, dr, t, inv, af, s.mla.rope_interleave);
    auto kvb = matvec(w[p + "kv_b_proj.weight"], NH * (dn + dv), L, lat.data());
    q[t].resize(NH * qk), k[t].resize(NH * qk), v[t].resize(NH * dv);
    for (int64_t h = 0; h < NH; ++h) {
      auto qr = ref_rope(qs.data() + h * qk + dn, dr, t, inv, af, s.mla.rope_interleave);
      for (int64_t i = 0; i < dn; ++i) q[t][h * qk + i] = qs[h * qk + i], k[t][h * qk + i] = kvb[h * (dn + dv) + i];
      for (int64_t i = 0; i < dr; ++i) q[t][h * qk + dn + i] = qr[i], k[t][h * qk + dn + i] = kr[i];
      for (int64_t i = 0; i < dv; ++i) v[t][h * dv + i] = kvb[h * (dn + dv) + dn + i];
    }
  }
  std::vector<std::vector<double>> out(len);
  for (int64_t t = 0; t < len; ++t) {
    std::vector<double> attn(NH * dv, 0.0);
    for (int64_t h = 0; h < NH; ++h) {
      std::vector<double> sc(t + 1);
      double mx = -1e300;
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int64_t i = 0; i < qk; ++i) d += q[t][h * qk + i] * k[j][h * qk + i];
        sc[j] = d * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (auto& e : sc) sum += (e = std::exp(e - mx));
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t i = 0; i < dv; ++i) attn[h * dv + i] += sc[j] / sum * v[j][h * dv + i];
    }
    out[t] = matvec(w[p + "o_proj.weight"], H, NH * dv, attn.data(), opt(p + "o_proj.bias"));
  }
  return out;
}

// ---- running the block like the decoder does ----

struct Seq {
  int64_t len;
  std::vector<int32_t> table;             // logical block -> physical block
  std::vector<std::vector<double>> x;     // [len][H] hidden states (normed input of the block)
};

struct Chunk {
  int seq;
  int64_t start, len;
};

constexpr int64_t kBlockSize = 4, kNumBlocks = 24;

class Runner {
 public:
  Runner(const ModelSpec& spec, const Checkpoint& ckpt, int tp_rank, int tp_size, int64_t layer = kLayer)
      : backend_(make_cpu_backend()), scratch_(*backend_), loader_(ckpt, *backend_) {
    const ShardPlan plan = ShardPlan::make(spec, tp_rank, tp_size);
    block_ = make_mla_attention(spec, plan, layer, loader_);
    cache_.assign(static_cast<size_t>(kNumBlocks * kBlockSize * block_->k_width()), NAN);
    H_ = spec.hidden_size;
  }
  AttentionBlock& block() { return *block_; }
  const std::vector<float>& cache() const { return cache_; }

  // One step over the chunks; returns out [T, H].
  std::vector<float> step(const std::vector<Seq>& seqs, const std::vector<Chunk>& chunks) {
    std::vector<float> h;
    std::vector<int32_t> pos;
    std::vector<int64_t> slots;
    std::vector<int32_t> blocks, start;
    for (const Chunk& c : chunks) {
      const Seq& s = seqs[c.seq];
      const auto first = static_cast<int32_t>(blocks.size());
      blocks.insert(blocks.end(), s.table.begin(), s.table.end());
      for (int64_t p = c.start; p < c.start + c.len; ++p) {
        for (double e : s.x[p]) h.push_back(static_cast<float>(e));
        pos.push_back(static_cast<int32_t>(p));
        slots.push_back(static_cast<int64_t>(s.table[p / kBlockSize]) * kBlockSize + p % kBlockSize);
        start.push_back(first);
      }
    }
    StepContext ctx;
    ctx.T = static_cast<int64_t>(pos.size());
    ctx.pos = pos.data();
    ctx.slots = slots.data();
    ctx.tables = BlockTables{blocks.data(), start.data(), blocks.data(), start.data()};
    ctx.block_size = kBlockSize;
    std::vector<float> out(static_cast<size_t>(ctx.T * H_), NAN);
    block_->forward(h.data(), ctx, KvCacheRef{cache_.data(), nullptr, DType::F32}, scratch_, out.data());
    return out;
  }

 private:
  std::unique_ptr<ComputeBackend> backend_;
  Scratch scratch_;
  WeightLoader loader_;
  std::unique_ptr<AttentionBlock> block_;
  std::vector<float> cache_;
  int64_t H_ = 0;
};

// Three sequences (13, 7 and 19 tokens) with scrambled, interleaved blocks: prefill chunks, then
// a mixed step (a second chunk, a decode token, another chunk), then decode steps.
std::vector<Seq> make_seqs(int64_t H) {
  std::vector<Seq> seqs = {{13, {5, 17, 2, 9}, {}}, {7, {11, 0}, {}}, {19, {3, 22, 14, 7, 20}, {}}};
  std::mt19937 rng(99);
  std::normal_distribution<double> N(0.0, 1.0);
  for (auto& s : seqs) {
    s.x.resize(s.len);
    for (auto& row : s.x) {
      row.resize(H);
      for (auto& e : row) e = static_cast<double>(static_cast<float>(N(rng)));
    }
  }
  return seqs;
}

const std::vector<std::vector<Chunk>> kSteps = {
    {{0, 0, 7}, {1, 0, 5}, {2, 0, 10}},
    {{0, 7, 4}, {1, 5, 1}, {2, 10, 6}},
    {{0, 11, 1}, {1, 6, 1}, {2, 16, 1}},
    {{2, 17, 1}, {0, 12, 1}},
    {{2, 18, 1}},
};

class MlaBlock : public ::testing::TestWithParam<Variant> {};

TEST_P(MlaBlock, MatchesNaiveReferenceAcrossStepsAndTp) {
  const Variant v = GetParam();
  const ModelSpec spec = make_spec(v);
  test::ScratchDir dir;
  const TinyWeights w = write_checkpoint(spec, v.bf16, dir.str(), v.fp8);
  auto ckpt = Checkpoint::open(dir.str());
  const std::vector<Seq> seqs = make_seqs(spec.hidden_size);
  std::vector<std::vector<std::vector<double>>> ref;
  double ref_max = 0;
  for (const Seq& s : seqs) {
    ref.push_back(reference(spec, w, s.x));
    for (const auto& row : ref.back())
      for (double e : row) ref_max = std::max(ref_max, std::fabs(e));
  }
  ASSERT_GT(ref_max, 0.1);
  const double tol = 2e-5 * ref_max;

  Runner tp1(spec, *ckpt, 0, 1), r0(spec, *ckpt, 0, 2), r1(spec, *ckpt, 1, 2);
  EXPECT_EQ(tp1.block().k_width(), spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim);
  EXPECT_EQ(tp1.block().v_width(), 0);
  EXPECT_EQ(r1.block().k_width(), tp1.block().k_width());  // the whole latent on every rank
  const int64_t H = spec.hidden_size;
  std::vector<std::vector<float>> step_out;
  for (size_t si = 0; si < kSteps.size(); ++si) {
    const auto& chunks = kSteps[si];
    const std::vector<float> out = tp1.step(seqs, chunks);
    const std::vector<float> a = r0.step(seqs, chunks), b = r1.step(seqs, chunks);
    int64_t t = 0;
    for (const Chunk& c : chunks)
      for (int64_t p = c.start; p < c.start + c.len; ++p, ++t)
        for (int64_t i = 0; i < H; ++i) {
          const double want = ref[c.seq][p][i];
          ASSERT_NEAR(out[t * H + i], want, tol) << v.name << " step " << si << " seq " << c.seq << " pos " << p;
          ASSERT_NEAR(a[t * H + i] + b[t * H + i], out[t * H + i], 1e-5 * ref_max)
              << v.name << " tp2 step " << si << " seq " << c.seq << " pos " << p;
        }
    step_out.push_back(out);
  }
  // Every rank computes and caches the same latents, bit for bit.
  ASSERT_EQ(0, std::memcmp(tp1.cache().data(), r0.cache().data(), tp1.cache().size() * 4)) << v.name;
  ASSERT_EQ(0, std::memcmp(tp1.cache().data(), r1.cache().data(), tp1.cache().size() * 4)) << v.name;

  // Batch invariance: each token of the mixed step 1 run alone gives the same bits (its cache
  // row is rewritten with the same values; later positions are not read).
  int64_t t = 0;
  for (const Chunk& c : kSteps[1])
    for (int64_t p = c.start; p < c.start + c.len; ++p, ++t) {
      const std::vector<float> alone = tp1.step(seqs, {{c.seq, p, 1}});
      ASSERT_EQ(0, std::memcmp(alone.data(), step_out[1].data() + t * H, H * 4))
          << v.name << " seq " << c.seq << " pos " << p;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, MlaBlock,
    ::testing::Values(Variant{"q_proj_yarn_interleaved_f32", 0, true, true, false, false},
                      Variant{"q_lora_yarn_interleaved_bf16_bias", 24, true, true, true, true},
                      Variant{"q_lora_yarn_rotate_half_f32", 24, false, true, false, false},
                      Variant{"q_proj_default_rope_bf16", 0, false, false, true, false},
                      Variant{"q_lora_yarn_interleaved_fp8", 24, true, true, false, false, true}),
    [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

TEST(MlaBlock, MissingTensorNamesIt) {
  Variant v{"x", 24, true, true, false, false};
  const ModelSpec spec = make_spec(v);
  test::ScratchDir dir;
  write_checkpoint(spec, false, dir.str());
  auto ckpt = Checkpoint::open(dir.str());
  auto backend = make_cpu_backend();
  WeightLoader loader(*ckpt, *backend);
  ModelSpec no_lora = spec;
  no_lora.mla.q_lora_rank = 0;  // the checkpoint has q_a/q_b, not q_proj
  test::expect_error([&] { make_mla_attention(no_lora, ShardPlan::make(no_lora), kLayer, loader); },
                     {"q_proj"});
}

// Against transformers' DeepseekV3Attention: a directory written by mla_hf_compare.py (which runs
// this test with SHARDLM_MLA_HF_DUMP set); skipped otherwise.
TEST(MlaHf, MatchesTransformersDump) {
  const char* dump = std::getenv("SHARDLM_MLA_HF_DUMP");
  if (!dump) GTEST_SKIP() << "SHARDLM_MLA_HF_DUMP not set (run tests/arch/mla_hf_compare.py)";
  const std::string dir = dump;
  const nlohmann::json j = nlohmann::json::parse(shardlm::read_file(dir + "/spec.json"));
  ModelSpec spec;
  spec.hidden_size = j.at("hidden_size");
  spec.num_heads = spec.num_kv_heads = j.at("num_heads");
  spec.num_layers = 1;
  spec.intermediate_size = 32;
  spec.vocab_size = 64;
  spec.head_dim = j.at("qk_rope_head_dim");
  spec.rope_theta = j.at("rope_theta");
  spec.attention_bias = spec.o_proj_bias = j.at("attention_bias").get<bool>();
  spec.mla.q_lora_rank = j.at("q_lora_rank");
  spec.mla.kv_lora_rank = j.at("kv_lora_rank");
  spec.mla.qk_nope_head_dim = j.at("qk_nope_head_dim");
  spec.mla.qk_rope_head_dim = j.at("qk_rope_head_dim");
  spec.mla.v_head_dim = j.at("v_head_dim");
  spec.mla.rope_interleave = j.at("rope_interleave").get<bool>();
  if (!j.at("yarn").is_null()) {
    const auto& y = j.at("yarn");
    RopeScaling& rs = spec.rope_scaling;
    rs.kind = RopeScaling::Kind::kYarn;
    rs.factor = y.at("factor");
    rs.original_max_position_embeddings = y.at("original_max_position_embeddings");
    rs.beta_fast = y.at("beta_fast");
    rs.beta_slow = y.at("beta_slow");
    rs.mscale = y.at("mscale");
    rs.mscale_all_dim = y.at("mscale_all_dim");
  }
  EXPECT_EQ(attention_softmax_scale(spec, spec.mla.qk_head_dim()), static_cast<float>(j.at("scaling").get<double>()));
  auto ckpt = Checkpoint::open(dir);
  auto io = Checkpoint::open(dir + "/io");
  const int64_t H = spec.hidden_size;
  std::vector<Seq> seqs;
  std::vector<const float*> want;
  int32_t next_block = 0;
  double out_max = 0;
  for (size_t s = 0; s < j.at("seq_lens").size(); ++s) {
    Seq q;
    q.len = j.at("seq_lens")[s];
    for (int64_t b = 0; b < (q.len + kBlockSize - 1) / kBlockSize; ++b) q.table.push_back(next_block++);
    std::reverse(q.table.begin(), q.table.end());  // not in order
    const auto& x = io->get("x" + std::to_string(s), {q.len, H});
    const float* xp = static_cast<const float*>(x.data);
    for (int64_t p = 0; p < q.len; ++p) q.x.emplace_back(xp + p * H, xp + (p + 1) * H);
    const auto& o = io->get("out" + std::to_string(s), {q.len, H});
    want.push_back(static_cast<const float*>(o.data));
    for (int64_t i = 0; i < q.len * H; ++i) out_max = std::max(out_max, static_cast<double>(std::fabs(want.back()[i])));
    seqs.push_back(std::move(q));
  }
  ASSERT_LE(next_block, kNumBlocks);
  // Prefill all but the last three tokens of each sequence in one step, then decode together.
  Runner run(spec, *ckpt, 0, 1, 0);
  std::vector<std::vector<Chunk>> steps(4);
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    const int64_t pre = std::max<int64_t>(1, seqs[s].len - 3);
    steps[0].push_back({s, 0, pre});
    for (int64_t p = pre; p < seqs[s].len; ++p) steps[p - pre + 1].push_back({s, p, 1});
  }
  for (const auto& chunks : steps) {
    if (chunks.empty()) continue;
    const std::vector<float> out = run.step(seqs, chunks);
    int64_t t = 0;
    for (const Chunk& c : chunks)
      for (int64_t p = c.start; p < c.start + c.len; ++p, ++t)
        for (int64_t i = 0; i < H; ++i)
          ASSERT_NEAR(out[t * H + i], want[c.seq][p * H + i], 1e-5 * out_max) << "seq " << c.seq << " pos " << p;
  }
}

}  // namespace
