#include "model/model_spec.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"

namespace shardlm {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Defaults transformers applies per architecture when a key is absent from config.json.
struct ArchDefaults {
  const char* architecture;
  const char* model_type;
  int64_t max_position_embeddings;
  int64_t head_dim;                // 0: hidden_size / num_attention_heads
  bool qkv_bias_always;            // Qwen2: q/k/v carry a bias, o_proj none, attention_bias ignored
  bool attention_bias_covers_o;    // Llama/Qwen3: attention_bias applies to o_proj too
  bool attention_bias_from_config; // false for Mistral (never any bias)
  bool mlp_bias_from_config;       // Llama only
  bool qk_norm;                    // Qwen3
  // Which layers slide, as each architecture's transformers config builds layer_types: kAlways every
  // layer (layer_types ignored), kQwen those from max_window_layers on, kQwen2Moe the even ones
  // below it, kQwen3Moe every layer once use_sliding_window is set.
  enum class Sliding { kNone, kAlways, kQwen, kQwen2Moe, kQwen3Moe } sliding;
  int64_t sliding_window_default;  // when the key is absent
  enum class Ffn { kDense, kMixtral, kQwenMoe, kDeepseek } ffn = Ffn::kDense;
  bool mla = false;                // Multi-head Latent Attention instead of GQA
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
};

const ArchDefaults kArchs[] = {
    {"LlamaForCausalLM", "llama", 2048, 0, false, true, true, true, false, ArchDefaults::Sliding::kNone, 0},
    {"MistralForCausalLM", "mistral", 4096 * 32, 0, false, false, false, false, false, ArchDefaults::Sliding::kAlways,
     4096},
    {"Qwen2ForCausalLM", "qwen2", 32768, 0, true, false, false, false, false, ArchDefaults::Sliding::kQwen, 4096},
    {"Qwen3ForCausalLM", "qwen3", 32768, 128, false, true, true, false, true, ArchDefaults::Sliding::kQwen, 4096},
    {"MixtralForCausalLM", "mixtral", 4096 * 32, 0, false, false, false, false, false, ArchDefaults::Sliding::kAlways,
     0, ArchDefaults::Ffn::kMixtral, false, 1e-5, 1e6},
    {"Qwen2MoeForCausalLM", "qwen2_moe", 32768, 0, true, false, false, false, false, ArchDefaults::Sliding::kQwen2Moe,
     4096, ArchDefaults::Ffn::kQwenMoe},
    // Qwen3-MoE's config has no head_dim default (transformers takes hidden / heads), dense Qwen3's is 128.
    {"Qwen3MoeForCausalLM", "qwen3_moe", 32768, 0, false, true, true, false, true, ArchDefaults::Sliding::kQwen3Moe,
     4096, ArchDefaults::Ffn::kQwenMoe},
    {"DeepseekV3ForCausalLM", "deepseek_v3", 4096, 0, false, false, false, false, false, ArchDefaults::Sliding::kNone,
     0, ArchDefaults::Ffn::kDeepseek, true},
};

const ArchDefaults* find_arch(const std::string& name) {
  for (const auto& a : kArchs)
    if (name == a.architecture) return &a;
  return nullptr;
}


// Field accessors: every error names the file (origin) and the field.
class Fields {
 public:
  Fields(const json& j, const std::string& origin) : j_(j), origin_(origin) {}

  bool present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool contains(const char* key) const { return j_.contains(key); }
  const json& at(const char* key) const { return j_[key]; }

  int64_t integer(const char* key, std::optional<int64_t> dflt) const {
    if (!present(key)) {
      SHARDLM_CHECK(dflt.has_value(), origin_ << ": required field '" << key << "' is missing");
      return *dflt;
    }
    const json& v = j_[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {  // "4096.0" is tolerated when it is integral
      double d = v.get<double>();
      SHARDLM_CHECK(d == static_cast<double>(static_cast<int64_t>(d)),
                    origin_ << ": field '" << key << "' must be an integer, got " << v.dump());
      return static_cast<int64_t>(d);
    }
    SHARDLM_FAIL(origin_ << ": field '" << key << "' must be an integer, got " << v.dump());
  }

  double number(const char* key, double dflt) const {
    if (!present(key)) return dflt;
    const json& v = j_[key];
    SHARDLM_CHECK(v.is_number(), origin_ << ": field '" << key << "' must be a number, got " << v.dump());
    return v.get<double>();
  }

  bool boolean(const char* key, bool dflt) const {
    if (!present(key)) return dflt;
    const json& v = j_[key];
    SHARDLM_CHECK(v.is_boolean(), origin_ << ": field '" << key << "' must be true or false, got " << v.dump());
    return v.get<bool>();
  }

  std::string string(const char* key, const std::string& dflt) const {
    if (!present(key)) return dflt;
    const json& v = j_[key];
    SHARDLM_CHECK(v.is_string(), origin_ << ": field '" << key << "' must be a string, got " << v.dump());
    return v.get<std::string>();
  }

  // int, list of ints, or null/absent (empty).
  std::vector<int32_t> int_list(const char* key) const {
    std::vector<int32_t> out;
    if (!present(key)) return out;
    const json& v = j_[key];
    auto one = [&](const json& x) {
      SHARDLM_CHECK(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX,
                    origin_ << ": field '" << key << "' must be a token id or a list of token ids, got " << v.dump());
      out.push_back(static_cast<int32_t>(x.get<int64_t>()));
    };
    if (v.is_array()) {
      for (const auto& x : v) one(x);
    } else {
      one(v);
    }
    return out;
  }

 private:
  const json& j_;
  const std::string& origin_;
};

json parse_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    SHARDLM_FAIL(origin << ": not valid JSON: " << e.what());
  }
  SHARDLM_CHECK(j.is_object(), origin << ": expected a JSON object at the top level");
  return j;
}

DType parse_torch_dtype(const std::string& s, const std::string& origin, const char* field) {
  if (s == "float32" || s == "float") return DType::F32;
  if (s == "bfloat16") return DType::BF16;
  if (s == "float16" || s == "half") return DType::F16;
  SHARDLM_FAIL(origin << ": field '" << field << "' has unsupported value '" << s
                      << "' (supported: float32, bfloat16, float16)");
}

// The RoPE object (rope_scaling, or transformers v5's rope_parameters), read as transformers 5's
// standardize_rope_params completes it: no type is "default"; llama3 and yarn take
// original_max_position_embeddings from the top level where config.json has one there (Phi-3 style,
// transformers' own exception), else from the object, else max_position_embeddings.
RopeScaling parse_rope(const json& r, const std::string& origin, const std::string& field, const Fields& f,
                       int64_t max_position_embeddings) {
  RopeScaling rs;
  if (r.is_null()) return rs;
  SHARDLM_CHECK(r.is_object(), origin << ": field '" << field << "' must be an object or null, got " << r.dump());
  const char* type_key = r.contains("rope_type") && !r["rope_type"].is_null() ? "rope_type" : "type";
  std::string type = "default";
  if (r.contains(type_key) && !r[type_key].is_null()) {
    SHARDLM_CHECK(r[type_key].is_string(), origin << ": field '" << field << "." << type_key << "' must be a string");
    type = r[type_key].get<std::string>();
  }
  if (r.contains("partial_rotary_factor") && !r["partial_rotary_factor"].is_null()) {
    SHARDLM_CHECK(r["partial_rotary_factor"].is_number() && r["partial_rotary_factor"].get<double>() == 1.0,
                  origin << ": field '" << field << ".partial_rotary_factor' is " << r["partial_rotary_factor"].dump()
                         << ": RoPE over part of each head is not supported");
  }
  auto num = [&](const char* k) -> double {
    SHARDLM_CHECK(r.contains(k) && r[k].is_number(),
                  origin << ": field '" << field << "." << k << "' is required for rope_type " << type);
    return r[k].get<double>();
  };
  auto original_max_positions = [&]() -> int64_t {
    if (f.present("original_max_position_embeddings")) return f.integer("original_max_position_embeddings", 0);
    if (!r.contains("original_max_position_embeddings") || r["original_max_position_embeddings"].is_null())
      return max_position_embeddings;
    const double omp = num("original_max_position_embeddings");
    SHARDLM_CHECK(omp == static_cast<double>(static_cast<int64_t>(omp)),
                  origin << ": field '" << field << ".original_max_position_embeddings' must be an integer");
    return static_cast<int64_t>(omp);
  };
  if (type == "default") return rs;
  if (type == "linear") {
    rs.kind = RopeScaling::Kind::kLinear;
    rs.factor = num("factor");
  } else if (type == "llama3") {
    rs.kind = RopeScaling::Kind::kLlama3;
    rs.factor = num("factor");
    rs.low_freq_factor = num("low_freq_factor");
    rs.high_freq_factor = num("high_freq_factor");
    rs.original_max_position_embeddings = original_max_positions();
  } else if (type == "yarn") {
    rs.kind = RopeScaling::Kind::kYarn;
    rs.original_max_position_embeddings = original_max_positions();
    SHARDLM_CHECK(rs.original_max_position_embeddings > 0,
                  origin << ": field 'original_max_position_embeddings' must be positive, got "
                         << rs.original_max_position_embeddings);
    // A null factor is the context's extension, as transformers' yarn computes it.
    rs.factor = r.contains("factor") && r["factor"].is_null()
                    ? static_cast<double>(max_position_embeddings) / rs.original_max_position_embeddings
                    : num("factor");
    auto opt = [&](const char* k, double dflt) {
      if (!r.contains(k) || r[k].is_null()) return dflt;
      SHARDLM_CHECK(r[k].is_number(), origin << ": field '" << field << "." << k << "' must be a number");
      return r[k].get<double>();
    };
    // A zero beta falls back to the default, as transformers' `or` does.
    rs.beta_fast = opt("beta_fast", 32.0);
    if (rs.beta_fast == 0) rs.beta_fast = 32.0;
    rs.beta_slow = opt("beta_slow", 1.0);
    if (rs.beta_slow == 0) rs.beta_slow = 1.0;
    rs.mscale = opt("mscale", 0.0);
    rs.mscale_all_dim = opt("mscale_all_dim", 0.0);
    rs.attention_factor = opt("attention_factor", 0.0);
    if (r.contains("truncate") && !r["truncate"].is_null()) {
      SHARDLM_CHECK(r["truncate"].is_boolean(), origin << ": field '" << field << ".truncate' must be true or false");
      rs.truncate = r["truncate"].get<bool>();
    }
  } else {
    SHARDLM_FAIL(origin << ": field '" << field << "." << type_key << "' has unsupported value '" << type
                        << "' (supported: null, \"default\", \"linear\", \"llama3\", \"yarn\")");
  }
  SHARDLM_CHECK(rs.factor > 0, origin << ": field '" << field << ".factor' must be positive");
  return rs;
}

// The sliding window and the layers it applies to, as transformers 5 builds them.
void parse_sliding_window(const json& j, const Fields& f, const ArchDefaults& arch, const std::string& origin,
                          ModelSpec* s) {
  if (arch.sliding == ArchDefaults::Sliding::kNone) return;
  int64_t window = arch.sliding_window_default;
  if (j.contains("sliding_window")) window = j["sliding_window"].is_null() ? 0 : f.integer("sliding_window", 0);
  // Only Mistral and Mixtral slide without use_sliding_window.
  if (arch.sliding != ArchDefaults::Sliding::kAlways && !f.boolean("use_sliding_window", false)) window = 0;
  SHARDLM_CHECK(window >= 0, origin << ": field 'sliding_window' must be non-negative, got " << window);
  if (window == 0) return;
  const int64_t n = s->num_layers;
  std::vector<uint8_t> slides(static_cast<size_t>(std::max<int64_t>(n, 0)), 0);
  const bool reads_layer_types =
      arch.sliding == ArchDefaults::Sliding::kQwen || arch.sliding == ArchDefaults::Sliding::kQwen2Moe;
  if (reads_layer_types && f.present("layer_types")) {
    const json& types = f.at("layer_types");
    SHARDLM_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == n,
                  origin << ": field 'layer_types' must list one type per layer (num_hidden_layers = " << n << "), got "
                         << (types.is_array() ? std::to_string(types.size()) + " entries" : "no list"));
    for (int64_t i = 0; i < n; ++i) {
      const json& t = types[static_cast<size_t>(i)];
      const bool known = t.is_string() && (t == "full_attention" || t == "sliding_attention");
      SHARDLM_CHECK(known, origin << ": field 'layer_types' entry " << i << " is " << t.dump().substr(0, 60)
                                  << " (supported: \"full_attention\", \"sliding_attention\")");
      slides[static_cast<size_t>(i)] = t == "sliding_attention";
    }
  } else {
    const int64_t max_window_layers = f.integer("max_window_layers", 28);
    for (int64_t i = 0; i < n; ++i) {
      switch (arch.sliding) {
        case ArchDefaults::Sliding::kQwen:
          slides[i] = i >= max_window_layers;
          break;
        case ArchDefaults::Sliding::kQwen2Moe:
          slides[i] = i % 2 == 0 && i < max_window_layers;
          break;
        default:
          slides[i] = 1;
          break;
      }
    }
  }
  if (std::find(slides.begin(), slides.end(), 1) == slides.end()) return;  // no layer slides
  s->sliding_window = window;
  s->sliding_layers = std::move(slides);
}

// Mixture-of-Experts fields, named as each architecture's config names them.
void parse_moe(const json& j, const Fields& f, const ArchDefaults& arch, const std::string& origin, ModelSpec* s) {
  MoeSpec& m = s->moe;
  using Ffn = ArchDefaults::Ffn;
  if (arch.ffn == Ffn::kDense) return;
  m.experts_per_token = f.integer("num_experts_per_tok", std::nullopt);
  const char* experts_key = "";
  const char* intermediate_key = "moe_intermediate_size";
  if (arch.ffn == Ffn::kMixtral) {
    m.naming = MoeSpec::Naming::kMixtral;
    m.num_experts = f.integer("num_local_experts", std::nullopt);
    experts_key = "num_local_experts";
    m.expert_intermediate = s->intermediate_size;
    intermediate_key = "intermediate_size";
    m.norm_topk_prob = true;  // Mixtral always renormalises the chosen experts' weights
  } else if (arch.ffn == Ffn::kQwenMoe) {
    m.naming = MoeSpec::Naming::kQwen;
    m.num_experts = f.integer("num_experts", std::nullopt);
    experts_key = "num_experts";
    m.expert_intermediate = f.integer("moe_intermediate_size", std::nullopt);
    m.norm_topk_prob = f.boolean("norm_topk_prob", false);
    m.sparse_step = f.integer("decoder_sparse_step", 1);
    if (f.present("mlp_only_layers")) {
      const json& v = j["mlp_only_layers"];
      SHARDLM_CHECK(v.is_array(), origin << ": field 'mlp_only_layers' must be a list of layer indices");
      for (const auto& x : v) {
        SHARDLM_CHECK(x.is_number_integer(), origin << ": field 'mlp_only_layers' must be a list of layer indices");
        m.mlp_only_layers.push_back(x.get<int64_t>());
      }
    }
    if (s->architecture == "Qwen2MoeForCausalLM") {
      m.shared_intermediate = f.integer("shared_expert_intermediate_size", std::nullopt);
      m.shared_expert_gate = m.shared_intermediate > 0;
    }
  } else {
    m.naming = MoeSpec::Naming::kDeepseek;
    m.num_experts = f.integer("n_routed_experts", std::nullopt);
    experts_key = "n_routed_experts";
    m.expert_intermediate = f.integer("moe_intermediate_size", std::nullopt);
    m.norm_topk_prob = f.boolean("norm_topk_prob", true);
    // DeepSeek-V3's router, as transformers' DeepseekV3TopkRouter and DeepSeek's own modeling
    // code run it: sigmoid scores, the e_score_correction_bias added for the choice, the top
    // topk_group groups by the sum of their two best scores. Other values (DeepSeek-V2's softmax,
    // greedy or max-per-group routing) are refused rather than routed another way.
    const std::string scoring = f.string("scoring_func", "sigmoid");
    SHARDLM_CHECK(scoring == "sigmoid", origin << ": field 'scoring_func' has unsupported value '" << scoring << "' ("
                                               << s->architecture << " routes by sigmoid scores; supported: sigmoid)");
    m.scoring = MoeSpec::Scoring::kSigmoid;
    const std::string method = f.string("topk_method", "noaux_tc");
    SHARDLM_CHECK(method == "noaux_tc", origin << ": field 'topk_method' has unsupported value '" << method << "' ("
                                               << s->architecture
                                               << " routes with the score correction bias; supported: noaux_tc)");
    m.score_correction_bias = true;
    // Defaults where the config leaves a field out: transformers' DeepseekV3Config's (DeepSeek-V3's
    // own values), so that a trimmed config routes as transformers routes it.
    m.n_group = f.integer("n_group", 8);
    m.topk_group = f.integer("topk_group", 4);
    m.routed_scaling_factor = f.number("routed_scaling_factor", 2.5);
    m.shared_intermediate = f.integer("n_shared_experts", 1) * m.expert_intermediate;
    m.first_dense_layers = f.integer("first_k_dense_replace", 3);
  }
  auto positive = [&](int64_t v, const char* field) {
    SHARDLM_CHECK(v > 0, origin << ": field '" << field << "' must be positive, got " << v);
  };
  positive(m.num_experts, experts_key);
  positive(m.experts_per_token, "num_experts_per_tok");
  positive(m.expert_intermediate, intermediate_key);
  positive(m.sparse_step, "decoder_sparse_step");
  SHARDLM_CHECK(m.experts_per_token <= m.num_experts,
                origin << ": field 'num_experts_per_tok' (" << m.experts_per_token << ") exceeds the "
                       << m.num_experts << " experts");
  SHARDLM_CHECK(m.n_group > 0 && m.num_experts % m.n_group == 0,
                origin << ": field 'n_group' (" << m.n_group << ") must divide the " << m.num_experts << " experts");
  SHARDLM_CHECK(m.topk_group > 0 && m.topk_group <= m.n_group,
                origin << ": field 'topk_group' (" << m.topk_group << ") must be in [1, n_group " << m.n_group << "]");
  SHARDLM_CHECK(m.experts_per_token <= m.topk_group * (m.num_experts / m.n_group),
                origin << ": field 'num_experts_per_tok' exceeds the experts of topk_group groups");
  SHARDLM_CHECK(m.routed_scaling_factor > 0, origin << ": field 'routed_scaling_factor' must be positive");
}

void parse_mla(const Fields& f, const ArchDefaults& arch, const std::string& origin, ModelSpec* s) {
  if (!arch.mla) return;
  MlaSpec& a = s->mla;
  // Absent is transformers' default 1536 (DeepSeek-V3's); null is q_proj straight from the hidden state.
  a.q_lora_rank = f.contains("q_lora_rank") ? f.integer("q_lora_rank", 0) : 1536;
  a.kv_lora_rank = f.integer("kv_lora_rank", std::nullopt);
  a.qk_nope_head_dim = f.integer("qk_nope_head_dim", std::nullopt);
  a.qk_rope_head_dim = f.integer("qk_rope_head_dim", std::nullopt);
  a.v_head_dim = f.integer("v_head_dim", std::nullopt);
  a.rope_interleave = f.boolean("rope_interleave", true);
  SHARDLM_CHECK(a.q_lora_rank >= 0, origin << ": field 'q_lora_rank' must not be negative");
  SHARDLM_CHECK(a.kv_lora_rank > 0 && a.qk_nope_head_dim > 0 && a.v_head_dim > 0,
                origin << ": fields 'kv_lora_rank', 'qk_nope_head_dim' and 'v_head_dim' must be positive");
  SHARDLM_CHECK(a.qk_rope_head_dim > 0 && a.qk_rope_head_dim % 2 == 0,
                origin << ": field 'qk_rope_head_dim' must be positive and even, got " << a.qk_rope_head_dim);
  SHARDLM_CHECK(!f.boolean("attention_bias", false),
                origin << ": field 'attention_bias': biases in Multi-head Latent Attention are not supported");
  // RoPE runs over the rope part of each head only (transformers sets head_dim so).
  s->head_dim = a.qk_rope_head_dim;
}

// quantization_config: only DeepSeek's fp8 e4m3 with 2-D weight blocks is understood.
void parse_quant(const json& j, const std::string& origin, ModelSpec* s) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return;
  const json& q = j["quantization_config"];
  SHARDLM_CHECK(q.is_object(), origin << ": field 'quantization_config' must be an object");
  const std::string method = q.value("quant_method", std::string());
  SHARDLM_CHECK(method == "fp8", origin << ": field 'quantization_config.quant_method' has unsupported value '"
                                        << method << "' (supported: fp8)");
  const std::string fmt = q.value("fmt", std::string("e4m3"));
  SHARDLM_CHECK(fmt == "e4m3", origin << ": field 'quantization_config.fmt' has unsupported value '" << fmt
                                      << "' (supported: e4m3)");
  // Without weight_block_size the checkpoint holds one scale per tensor (weight_scale, and
  // input_scale for static activations, as AutoFP8 and llm-compressor write fp8): refused here by
  // name, not at the first weight as missing block scales.
  SHARDLM_CHECK(q.contains("weight_block_size") && !q["weight_block_size"].is_null(),
                origin << ": field 'quantization_config' has no weight_block_size: per-tensor fp8 (weight_scale"
                       << " and input_scale tensors) is not supported; shardlm reads block-scaled fp8"
                       << " (weight_block_size with weight_scale_inv tensors, as DeepSeek-V3 ships it)");
  s->quant.fp8_block = true;
  {
    const json& b = q["weight_block_size"];
    SHARDLM_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
                      b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0,
                  origin << ": field 'quantization_config.weight_block_size' must be two positive integers");
    s->quant.block_rows = b[0].get<int64_t>();
    s->quant.block_cols = b[1].get<int64_t>();
  }
}

std::string fnv1a64_hex(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

ModelSpec parse_impl(const std::string& config_json, const std::string& gen_json, const std::string& origin,
                     const std::string& gen_origin) {
  const json j = parse_json(config_json, origin);
  Fields f(j, origin);
  ModelSpec s;
  s.config_hash = fnv1a64_hex(config_json);

  // Architecture: "architectures"[0], else derived from model_type.
  s.model_type = f.string("model_type", "");
  if (f.present("architectures")) {
    const json& a = j["architectures"];
    SHARDLM_CHECK(a.is_array() && !a.empty() && a[0].is_string(),
                  origin << ": field 'architectures' must be a non-empty list of names, got " << a.dump());
    s.architecture = a[0].get<std::string>();
  } else {
    for (const auto& a : kArchs)
      if (s.model_type == a.model_type) s.architecture = a.architecture;
    SHARDLM_CHECK(!s.architecture.empty(), origin << ": field 'architectures' is missing and model_type '"
                                                  << s.model_type << "' does not identify a supported one");
  }
  const ArchDefaults* arch = find_arch(s.architecture);
  if (!arch) {
    s.validate(origin);  // throws, listing the supported architectures
  }
  if (s.model_type.empty()) s.model_type = arch->model_type;

  s.hidden_size = f.integer("hidden_size", std::nullopt);
  s.intermediate_size = f.integer("intermediate_size", std::nullopt);
  s.num_layers = f.integer("num_hidden_layers", std::nullopt);
  s.num_heads = f.integer("num_attention_heads", std::nullopt);
  SHARDLM_CHECK(s.num_heads > 0, origin << ": field 'num_attention_heads' must be positive, got " << s.num_heads);
  // Absent, transformers takes each config class's default; null (or absent for Llama), the head count.
  s.num_kv_heads = f.contains("num_key_value_heads") ? f.integer("num_key_value_heads", s.num_heads)
                                                     : ModelSpec::default_num_kv_heads(arch->architecture, s.num_heads);
  s.head_dim = f.integer("head_dim", arch->head_dim ? arch->head_dim : s.hidden_size / s.num_heads);
  s.vocab_size = f.integer("vocab_size", std::nullopt);
  s.max_position_embeddings = f.integer("max_position_embeddings", arch->max_position_embeddings);
  s.rms_norm_eps = f.number("rms_norm_eps", arch->rms_norm_eps);
  s.hidden_act = f.string("hidden_act", "silu");
  s.tie_word_embeddings = f.boolean("tie_word_embeddings", false);

  // Biases and norms, as each architecture's modeling code builds them.
  const bool attention_bias = f.boolean("attention_bias", false);
  if (arch->qkv_bias_always) {
    // Qwen2-MoE's config has a qkv_bias switch (true by default); Qwen2's has none.
    s.attention_bias = arch->ffn != ArchDefaults::Ffn::kQwenMoe || f.boolean("qkv_bias", true);
    s.o_proj_bias = false;
  } else if (arch->attention_bias_from_config) {
    s.attention_bias = attention_bias;
    s.o_proj_bias = arch->attention_bias_covers_o && attention_bias;
  }
  s.mlp_bias = arch->mlp_bias_from_config && f.boolean("mlp_bias", false);
  s.qk_norm = arch->qk_norm;

  parse_sliding_window(j, f, *arch, origin, &s);

  parse_moe(j, f, *arch, origin, &s);
  parse_mla(f, *arch, origin, &s);
  parse_quant(j, origin, &s);

  // RoPE: transformers <= 4.x writes rope_theta + rope_scaling; v5 writes rope_parameters. As v5
  // reads them (convert_rope_params_to_dict): a rope_scaling that is not null or {} replaces
  // rope_parameters whole; the object's rope_theta wins over the top-level one, which fills in for it.
  const auto truthy = [&](const char* key) {
    return j.contains(key) && !j[key].is_null() && !(j[key].is_object() && j[key].empty());
  };
  const char* rope_field = truthy("rope_scaling") ? "rope_scaling" : truthy("rope_parameters") ? "rope_parameters" : "";
  const json rope = *rope_field ? j[rope_field] : json(nullptr);
  if (rope.is_object() && rope.contains("rope_theta") && !rope["rope_theta"].is_null()) {
    SHARDLM_CHECK(rope["rope_theta"].is_number(),
                  origin << ": field '" << rope_field << ".rope_theta' must be a number");
    s.rope_theta = rope["rope_theta"].get<double>();
  } else {
    s.rope_theta = f.number("rope_theta", arch->rope_theta);
  }
  if (f.present("partial_rotary_factor")) {
    SHARDLM_CHECK(f.number("partial_rotary_factor", 1.0) == 1.0,
                  origin << ": field 'partial_rotary_factor' is " << f.at("partial_rotary_factor").dump()
                         << ": RoPE over part of each head is not supported");
  }
  if (*rope_field) s.rope_scaling = parse_rope(rope, origin, rope_field, f, s.max_position_embeddings);

  // dtype: "torch_dtype" (transformers 4.x) or "dtype" (v5).
  if (f.present("torch_dtype")) {
    s.torch_dtype = parse_torch_dtype(f.string("torch_dtype", ""), origin, "torch_dtype");
  } else if (f.present("dtype")) {
    s.torch_dtype = parse_torch_dtype(f.string("dtype", ""), origin, "dtype");
  }

  // Special tokens: config first, generation_config.json adds EOS ids and overrides BOS.
  auto bos = f.int_list("bos_token_id");
  SHARDLM_CHECK(bos.size() <= 1, origin << ": field 'bos_token_id' must be a single id");
  if (!bos.empty()) s.bos_token_id = bos[0];
  s.eos_token_ids = f.int_list("eos_token_id");
  if (!gen_json.empty()) {
    const json g = parse_json(gen_json, gen_origin);
    Fields gf(g, gen_origin);
    auto gbos = gf.int_list("bos_token_id");
    SHARDLM_CHECK(gbos.size() <= 1, gen_origin << ": field 'bos_token_id' must be a single id");
    if (!gbos.empty()) s.bos_token_id = gbos[0];
    for (int32_t id : gf.int_list("eos_token_id"))
      if (std::find(s.eos_token_ids.begin(), s.eos_token_ids.end(), id) == s.eos_token_ids.end())
        s.eos_token_ids.push_back(id);
  }

  s.validate(origin);
  return s;
}

}  // namespace

bool MoeSpec::layer_is_moe(int64_t layer) const {
  if (!enabled() || layer < first_dense_layers || (layer + 1) % sparse_step != 0) return false;
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

const std::vector<std::string>& ModelSpec::supported_architectures() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const auto& a : kArchs) out.push_back(a.architecture);
    return out;
  }();
  return v;
}

ModelSpec ModelSpec::load(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  SHARDLM_CHECK(fs::exists(config_path), "model directory " << dir << " has no config.json");
  const std::string config = read_file(config_path);
  const std::string gen = fs::exists(gen_path) ? read_file(gen_path) : std::string();
  return parse_impl(config, gen, config_path, gen_path);
}

ModelSpec ModelSpec::parse(const std::string& config_json, const std::string& generation_config_json,
                           const std::string& origin) {
  std::string gen_origin = origin + " (generation config)";
  fs::path p(origin);
  if (p.filename() == "config.json") gen_origin = (p.parent_path() / "generation_config.json").string();
  return parse_impl(config_json, generation_config_json, origin, gen_origin);
}

void ModelSpec::validate(const std::string& origin) const {
  if (!find_arch(architecture)) {
    std::string list;
    for (const auto& a : supported_architectures()) list += (list.empty() ? "" : ", ") + a;
    SHARDLM_FAIL(origin << ": field 'architectures': unsupported architecture '" << architecture
                        << "' (supported: " << list << ")");
  }
  auto positive = [&](int64_t v, const char* field) {
    SHARDLM_CHECK(v > 0, origin << ": field '" << field << "' must be positive, got " << v);
  };
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_layers, "num_hidden_layers");
  positive(num_heads, "num_attention_heads");
  positive(num_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  SHARDLM_CHECK(num_heads % num_kv_heads == 0, origin << ": field 'num_key_value_heads': num_attention_heads ("
                                                      << num_heads << ") is not a multiple of num_key_value_heads ("
                                                      << num_kv_heads << ")");
  SHARDLM_CHECK(head_dim % 2 == 0, origin << ": field 'head_dim' must be even for RoPE, got " << head_dim);
  SHARDLM_CHECK(rms_norm_eps > 0, origin << ": field 'rms_norm_eps' must be positive, got " << rms_norm_eps);
  SHARDLM_CHECK(rope_theta > 0, origin << ": field 'rope_theta' must be positive, got " << rope_theta);
  SHARDLM_CHECK(sliding_window >= 0, origin << ": field 'sliding_window' must be non-negative, got "
                                            << sliding_window);
  SHARDLM_CHECK(hidden_act == "silu" || hidden_act == "swish",
                origin << ": field 'hidden_act' has unsupported value '" << hidden_act << "' (supported: silu, swish)");
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    SHARDLM_CHECK(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor && rope_scaling.low_freq_factor > 0,
                  origin << ": field 'rope_scaling': llama3 needs 0 < low_freq_factor < high_freq_factor");
    SHARDLM_CHECK(rope_scaling.original_max_position_embeddings > 0,
                  origin << ": field 'rope_scaling.original_max_position_embeddings' must be positive");
  }
  // The attention factor YaRN puts on cos/sin is applied by the MLA block only.
  SHARDLM_CHECK(rope_scaling.kind != RopeScaling::Kind::kYarn || mla.enabled(),
                origin << ": field 'rope_scaling': yarn is supported for Multi-head Latent Attention models "
                          "(DeepSeek-V3, Kimi K2) only");
  SHARDLM_CHECK(bos_token_id < vocab_size, origin << ": field 'bos_token_id' (" << bos_token_id
                                                  << ") is not below vocab_size (" << vocab_size << ")");
  for (int32_t id : eos_token_ids)
    SHARDLM_CHECK(id < vocab_size, origin << ": field 'eos_token_id' (" << id << ") is not below vocab_size ("
                                          << vocab_size << ")");
}

int64_t ModelSpec::default_num_kv_heads(const std::string& architecture, int64_t num_heads) {
  static const std::pair<const char*, int64_t> kDefaults[] = {{"MistralForCausalLM", 8},   {"MixtralForCausalLM", 8},
                                                              {"Qwen2ForCausalLM", 32},    {"Qwen3ForCausalLM", 32},
                                                              {"Qwen2MoeForCausalLM", 16}, {"Qwen3MoeForCausalLM", 4}};
  for (const auto& [arch, heads] : kDefaults)
    if (architecture == arch) return heads;
  return num_heads;
}

}  // namespace shardlm
