#include "plan/model_footprint.h"

#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"
#include "model/model_spec.h"

namespace shardlm::plan {

namespace {

int64_t get_int(const nlohmann::json& c, const char* key, int64_t dflt) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return dflt;
  SHARDLM_CHECK(it->is_number(), "config.json: " << key << " must be a number, got " << it->dump());
  return it->get<int64_t>();
}

int64_t need_int(const nlohmann::json& c, const char* key) {
  const int64_t v = get_int(c, key, -1);
  SHARDLM_CHECK(v > 0, "config.json: " << key << " is missing or not positive");
  return v;
}

// A boolean or string field; missing or null: dflt.
bool get_bool(const nlohmann::json& c, const char* key, bool dflt) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return dflt;
  SHARDLM_CHECK(it->is_boolean(), "config.json: " << key << " must be true or false, got " << it->dump());
  return it->get<bool>();
}
std::string get_string(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return "";
  SHARDLM_CHECK(it->is_string(), "config.json: " << key << " must be a string, got " << it->dump());
  return it->get<std::string>();
}

int64_t blocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

struct Builder {
  ModelFootprint& m;
  std::vector<Piece>* out;
  int layer = 0;
  // A linear layer's weight [rows, cols] (out x in), `count` copies (experts).
  void mat(const char* name, Component c, Split s, int64_t rows, int64_t cols, int64_t count = 1) {
    out->push_back({name, c, s, Storage::Matrix, count * rows * cols,
                    count * blocks(rows, m.block_rows) * blocks(cols, m.block_cols), layer});
  }
  void vec(const char* name, Component c, Split s, int64_t n, Storage st = Storage::Bf16) {
    out->push_back({name, c, s, st, n, 0, layer});
  }
};

}  // namespace

WeightDtype parse_weight_dtype(const std::string& s) {
  if (s == "fp8") return WeightDtype::Fp8;
  if (s == "bf16") return WeightDtype::Bf16;
  SHARDLM_FAIL("unknown dtype '" << s << "' (fp8 or bf16)");
}

const char* to_string(WeightDtype d) { return d == WeightDtype::Fp8 ? "fp8" : "bf16"; }

const char* to_string(Component c) {
  switch (c) {
    case Component::Embedding: return "embedding";
    case Component::Attention: return "attention";
    case Component::DenseMlp: return "dense_mlp";
    case Component::RoutedExperts: return "routed_experts";
    case Component::SharedExperts: return "shared_experts";
    case Component::Router: return "router";
    case Component::Norms: return "norms";
    case Component::LmHead: return "lm_head";
  }
  return "?";
}

double Piece::bytes(WeightDtype d) const {
  switch (storage) {
    case Storage::Matrix:
      // fp8 e4m3: 1 byte per weight + one fp32 weight_scale_inv per block (DeepSeek's layout).
      return d == WeightDtype::Fp8 ? double(params) + 4.0 * double(scale_params) : 2.0 * double(params);
    case Storage::Bf16: return 2.0 * double(params);
    case Storage::Fp32: return 4.0 * double(params);
  }
  return 0;
}

ModelFootprint ModelFootprint::load(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::string name;
  if (fs::is_directory(p)) {
    name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
    p /= "config.json";
  } else {
    name = p.stem().string();
    if (name == "config") name = p.parent_path().filename().string();
  }
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_file(p.string()));
  } catch (const nlohmann::json::exception& e) {
    SHARDLM_FAIL(p.string() << ": not valid JSON: " << e.what());
  }
  return from_config(config, name);
}

ModelFootprint ModelFootprint::from_config(const nlohmann::json& c, const std::string& name) {
  SHARDLM_CHECK(c.is_object(), "config.json: expected a JSON object");
  ModelFootprint m;
  m.name = name;
  if (c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty())
    m.architecture = c["architectures"][0].get<std::string>();
  m.model_type = get_string(c, "model_type");
  m.hidden = need_int(c, "hidden_size");
  m.layers = need_int(c, "num_hidden_layers");
  m.heads = need_int(c, "num_attention_heads");
  m.kv_heads = c.contains("num_key_value_heads") ? get_int(c, "num_key_value_heads", m.heads)
                                                 : ModelSpec::default_num_kv_heads(m.architecture, m.heads);
  SHARDLM_CHECK(m.kv_heads > 0, "config.json: num_key_value_heads must be positive, got " << m.kv_heads);
  // Qwen3's config defaults head_dim to 128 (the loader's ModelSpec too); the others use hidden / heads.
  m.head_dim = get_int(c, "head_dim", m.architecture == "Qwen3ForCausalLM" ? 128 : m.hidden / m.heads);
  SHARDLM_CHECK(m.head_dim > 0, "config.json: head_dim must be positive, got " << m.head_dim);
  m.vocab = need_int(c, "vocab_size");
  m.intermediate = get_int(c, "intermediate_size", 0);
  m.tied_embeddings = get_bool(c, "tie_word_embeddings", false);

  if (c.contains("quantization_config") && c["quantization_config"].is_object()) {
    const auto& q = c["quantization_config"];
    m.native_fp8 = get_string(q, "quant_method") == "fp8";
    SHARDLM_CHECK(!m.native_fp8 || (q.contains("weight_block_size") && !q["weight_block_size"].is_null()),
                  "config.json: quantization_config has no weight_block_size: per-tensor fp8 is not supported"
                  " (shardlm reads block-scaled fp8, as DeepSeek-V3 ships it)");
    if (q.contains("weight_block_size") && q["weight_block_size"].is_array() && q["weight_block_size"].size() == 2) {
      const auto& b = q["weight_block_size"];
      SHARDLM_CHECK(
          b[0].is_number_integer() && b[1].is_number_integer() && b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0,
          "config.json: quantization_config.weight_block_size must be two positive integers, got " << b.dump());
      m.block_rows = b[0].get<int64_t>();
      m.block_cols = b[1].get<int64_t>();
    }
  }

  // MLA (DeepSeek-V2/V3 family).
  m.kv_lora_rank = get_int(c, "kv_lora_rank", 0);
  m.mla = m.kv_lora_rank > 0;
  if (m.mla) {
    // Null (DeepSeek-V2-Lite): a plain q_proj; absent: transformers' default 1536, as the loader.
    m.q_lora_rank = c.contains("q_lora_rank") ? get_int(c, "q_lora_rank", 0) : 1536;
    m.qk_nope_head_dim = need_int(c, "qk_nope_head_dim");
    m.qk_rope_head_dim = need_int(c, "qk_rope_head_dim");
    m.v_head_dim = need_int(c, "v_head_dim");
  }

  // MoE: DeepSeek n_routed_experts, Mixtral num_local_experts, Qwen-MoE num_experts.
  const bool deepseek_moe = get_int(c, "n_routed_experts", 0) > 0;
  m.n_routed_experts = deepseek_moe ? get_int(c, "n_routed_experts", 0)
                                    : get_int(c, "num_local_experts", get_int(c, "num_experts", 0));
  m.layer_is_moe.assign(m.layers, false);
  bool shared_gate = false;  // Qwen2-MoE's sigmoid gate on the shared expert
  if (m.moe()) {
    m.experts_per_token = need_int(c, "num_experts_per_tok");
    m.moe_intermediate = get_int(c, "moe_intermediate_size", m.intermediate);  // Mixtral: intermediate_size
    SHARDLM_CHECK(m.moe_intermediate > 0, "config.json: MoE model without moe_intermediate_size/intermediate_size");
    if (deepseek_moe) {
      // DeepSeek-V3's defaults where its config leaves them out (transformers' DeepseekV3Config).
      const bool v3 = m.architecture == "DeepseekV3ForCausalLM";
      // Every layer from first_k_dense_replace on is MoE, as the loader and transformers'
      // DeepseekV3 build it: moe_layer_freq (1 in the released configs) is not read by either.
      const int64_t first_dense = get_int(c, "first_k_dense_replace", v3 ? 3 : 0);
      for (int64_t i = 0; i < m.layers; ++i) m.layer_is_moe[i] = i >= first_dense;
      m.shared_intermediate = get_int(c, "n_shared_experts", v3 ? 1 : 0) * m.moe_intermediate;
      m.mtp_layers = get_int(c, "num_nextn_predict_layers", 0);
    } else {
      std::vector<int64_t> mlp_only;
      if (c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array())
        mlp_only = c["mlp_only_layers"].get<std::vector<int64_t>>();
      const int64_t step = get_int(c, "decoder_sparse_step", 1);
      for (int64_t i = 0; i < m.layers; ++i) {
        bool only = false;
        for (int64_t j : mlp_only) only = only || j == i;
        m.layer_is_moe[i] = !only && step > 0 && (i + 1) % step == 0;
      }
      m.shared_intermediate = get_int(c, "shared_expert_intermediate_size", 0);
      shared_gate = m.shared_intermediate > 0;
    }
  }
  for (bool b : m.layer_is_moe) m.moe_layers += b;
  if (m.moe_layers < m.layers)
    SHARDLM_CHECK(m.intermediate > 0, "config.json: intermediate_size is missing (needed by the dense MLP layers)");

  // Qwen2 always has q/k/v biases, Qwen2-MoE unless its qkv_bias switch is off (as the loader).
  const bool qkv_bias = get_bool(c, "attention_bias", false) || m.model_type == "qwen2" ||
                        (m.model_type == "qwen2_moe" && get_bool(c, "qkv_bias", true));
  const bool qk_norm = m.model_type == "qwen3" || m.model_type == "qwen3_moe";
  const bool router_bias = get_string(c, "topk_method") == "noaux_tc";
  const int64_t H = m.hidden;

  auto decoder_layer = [&](Builder& b, bool moe) {
    b.vec("input_layernorm", Component::Norms, Split::Replicated, H);
    b.vec("post_attention_layernorm", Component::Norms, Split::Replicated, H);
    if (m.mla) {
      const int64_t qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
      if (m.q_lora_rank > 0) {
        // Down-projections are not split by head: every tp rank holds them.
        b.mat("q_a_proj", Component::Attention, Split::Replicated, m.q_lora_rank, H);
        b.vec("q_a_layernorm", Component::Norms, Split::Replicated, m.q_lora_rank);
        b.mat("q_b_proj", Component::Attention, Split::Tp, m.heads * qk_head, m.q_lora_rank);
      } else {
        b.mat("q_proj", Component::Attention, Split::Tp, m.heads * qk_head, H);
      }
      b.mat("kv_a_proj_with_mqa", Component::Attention, Split::Replicated, m.kv_lora_rank + m.qk_rope_head_dim, H);
      b.vec("kv_a_layernorm", Component::Norms, Split::Replicated, m.kv_lora_rank);
      b.mat("kv_b_proj", Component::Attention, Split::Tp, m.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
      b.mat("o_proj", Component::Attention, Split::Tp, H, m.heads * m.v_head_dim);
    } else {
      const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
      b.mat("q_proj", Component::Attention, Split::Tp, q, H);
      b.mat("k_proj", Component::Attention, Split::TpKv, kv, H);
      b.mat("v_proj", Component::Attention, Split::TpKv, kv, H);
      b.mat("o_proj", Component::Attention, Split::Tp, H, q);
      if (qkv_bias) {
        b.vec("q_bias", Component::Attention, Split::Tp, q);
        b.vec("kv_bias", Component::Attention, Split::TpKv, 2 * kv);
      }
      if (qk_norm) b.vec("qk_norm", Component::Norms, Split::Replicated, 2 * m.head_dim);
    }
    if (!moe) {
      b.mat("mlp", Component::DenseMlp, Split::Tp, m.intermediate, H, 2);  // gate_proj, up_proj
      b.mat("mlp.down_proj", Component::DenseMlp, Split::Tp, H, m.intermediate);
      return;
    }
    const int64_t E = m.n_routed_experts, I = m.moe_intermediate;
    b.mat("experts", Component::RoutedExperts, Split::Ep, I, H, 2 * E);  // gate_proj, up_proj of each
    b.mat("experts.down_proj", Component::RoutedExperts, Split::Ep, H, I, E);
    b.vec("gate", Component::Router, Split::Replicated, E * H);
    if (router_bias) b.vec("gate.e_score_correction_bias", Component::Router, Split::Replicated, E, Storage::Fp32);
    if (m.shared_intermediate > 0) {
      b.mat("shared_experts", Component::SharedExperts, Split::Tp, m.shared_intermediate, H, 2);
      b.mat("shared_experts.down_proj", Component::SharedExperts, Split::Tp, H, m.shared_intermediate);
      if (shared_gate) b.vec("shared_expert_gate", Component::Router, Split::Replicated, H);
    }
  };

  Builder b{m, &m.pieces, -1};
  b.vec("embed_tokens", Component::Embedding, Split::Tp, m.vocab * H);  // vocab-parallel
  for (int64_t i = 0; i < m.layers; ++i) {
    b.layer = static_cast<int>(i);
    decoder_layer(b, m.layer_is_moe[i]);
  }
  b.layer = static_cast<int>(m.layers);
  b.vec("norm", Component::Norms, Split::Replicated, H);
  if (!m.tied_embeddings) b.vec("lm_head", Component::LmHead, Split::Tp, m.vocab * H);

  // DeepSeek-V3 multi-token prediction: each module is a full decoder layer plus enorm, hnorm,
  // eh_proj [H, 2H], and its own copy of embed_tokens and shared_head (norm + head) in the
  // checkpoint. Not used for plain decoding, so counted apart.
  Builder mb{m, &m.mtp_pieces, static_cast<int>(m.layers) + 1};
  for (int64_t k = 0; k < m.mtp_layers; ++k) {
    mb.vec("mtp.embed_tokens", Component::Embedding, Split::Tp, m.vocab * H);
    mb.vec("mtp.enorm_hnorm", Component::Norms, Split::Replicated, 2 * H);
    mb.mat("mtp.eh_proj", Component::DenseMlp, Split::Tp, H, 2 * H);
    decoder_layer(mb, m.moe());
    mb.vec("mtp.shared_head.norm", Component::Norms, Split::Replicated, H);
    mb.vec("mtp.shared_head.head", Component::LmHead, Split::Tp, m.vocab * H);
  }
  return m;
}

int64_t ModelFootprint::params() const {
  int64_t n = 0;
  for (const auto& p : pieces) n += p.params;
  return n;
}

int64_t ModelFootprint::mtp_params() const {
  int64_t n = 0;
  for (const auto& p : mtp_pieces) n += p.params;
  return n;
}

double ModelFootprint::bytes(WeightDtype d) const {
  double n = 0;
  for (const auto& p : pieces) n += p.bytes(d);
  return n;
}

int64_t ModelFootprint::params_of(Component c) const {
  int64_t n = 0;
  for (const auto& p : pieces) n += p.component == c ? p.params : 0;
  return n;
}

double ModelFootprint::bytes_of(Component c, WeightDtype d) const {
  double n = 0;
  for (const auto& p : pieces) n += p.component == c ? p.bytes(d) : 0;
  return n;
}

double ModelFootprint::scale_bytes(WeightDtype d) const {
  if (d != WeightDtype::Fp8) return 0;
  double n = 0;
  for (const auto& p : pieces) n += p.storage == Storage::Matrix ? 4.0 * double(p.scale_params) : 0;
  return n;
}

int64_t ModelFootprint::active_params_per_token() const {
  int64_t n = 0;
  for (const auto& p : pieces) {
    if (p.component == Component::Embedding) continue;  // a lookup, not a matmul
    if (p.component == Component::RoutedExperts)
      n += p.params / n_routed_experts * experts_per_token;
    else
      n += p.params;
  }
  return n;
}

int64_t ModelFootprint::kv_values_per_token_per_layer() const {
  return mla ? kv_lora_rank + qk_rope_head_dim : 2 * kv_heads * head_dim;
}

double ModelFootprint::attention_flops_per_position(bool decode) const {
  double per_head;
  if (mla)
    per_head = decode ? 2.0 * double(kv_lora_rank + qk_rope_head_dim) + 2.0 * double(kv_lora_rank)
                      : 2.0 * double(qk_nope_head_dim + qk_rope_head_dim) + 2.0 * double(v_head_dim);
  else
    per_head = 4.0 * double(head_dim);
  return per_head * double(heads) * double(layers);
}

}  // namespace shardlm::plan
