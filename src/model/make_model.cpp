#include "model/make_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "model/bpe_trainer.h"
#include "model/fp8_block.h"
#include "model/safetensors.h"

namespace shardlm {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

const unsigned char kCorpus[] = {
#include "model/tokenizer_corpus.inc"
};

constexpr const char* kBos = "<|bos|>";
constexpr int64_t kFp8Block = 128;
constexpr const char* kEos = "<|eos|>";

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}


void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  SHARDLM_CHECK(out, "cannot create " << path);
  out << text;
  out.close();
  SHARDLM_CHECK(out, "write error on " << path);
}

// Standard deviation of each tensor's initial values (mean 1 for norms).
double init_std(const HfTensorDecl& t, const ModelSpec& spec) {
  switch (t.role) {
    // Final hidden state has RMS ~1, so an output matrix of std 4/sqrt(hidden) gives logits of
    // std ~4: far from uniform, top choices well separated. Untied input embeddings use std 1;
    // tied ones must also serve as the output matrix, and a smaller scale also keeps the residual
    // stream from being dominated by the input token (which makes greedy output echo the input).
    case HfTensorDecl::Role::kEmbedding:
      return spec.tie_word_embeddings ? std::min(1.0, 4.0 / std::sqrt(static_cast<double>(spec.hidden_size))) : 1.0;
    case HfTensorDecl::Role::kLmHead: return 4.0 / std::sqrt(static_cast<double>(spec.hidden_size));
    case HfTensorDecl::Role::kProjection: return 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
    // Router logits of std ~1.5 spread the tokens over the experts with clear top-k margins.
    case HfTensorDecl::Role::kRouter: return 1.5 / std::sqrt(static_cast<double>(t.shape[1]));
    case HfTensorDecl::Role::kBias: return 0.2;
    case HfTensorDecl::Role::kNorm: return 0.1;
  }
  return 0.0;
}

ojson added_token(int32_t id, const char* content) {
  return ojson{{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
               {"rstrip", false},    {"normalized", false}, {"special", true}};
}

// Hugging Face tokenizer.json for a byte-level BPE (GPT-2 split regex, ByteLevel, BOS template).
ojson tokenizer_json(const BpeModel& bpe, int32_t bos, int32_t eos) {
  ojson vocab = ojson::object();
  for (size_t i = 0; i < bpe.tokens.size(); ++i) vocab[to_byte_level(bpe.tokens[i])] = static_cast<int32_t>(i);
  ojson merges = ojson::array();
  for (const auto& [a, b] : bpe.merges)
    merges.push_back(ojson::array({to_byte_level(bpe.tokens[a]), to_byte_level(bpe.tokens[b])}));
  ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                      {"use_regex", false}};
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = ojson::array({added_token(bos, kBos), added_token(eos, kEos)});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       ojson::array({ojson{{"type", "Split"},
                           {"pattern", {{"Regex", kGpt2SplitRegex}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                     byte_level})}};
  ojson bos_tok = {{"SpecialToken", {{"id", kBos}, {"type_id", 0}}}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", ojson::array({bos_tok, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", ojson::array({bos_tok,
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                             {{"SpecialToken", {{"id", kBos}, {"type_id", 1}}}},
                             {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
      {"special_tokens", {{kBos, {{"id", kBos}, {"ids", ojson::array({bos})}, {"tokens", ojson::array({kBos})}}}}}};
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j;
}

ojson tokenizer_config_json(int32_t bos, int32_t eos, int64_t max_len) {
  ojson j;
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  j["added_tokens_decoder"] = {{std::to_string(bos), added_token(bos, kBos)},
                               {std::to_string(eos), added_token(eos, kEos)}};
  for (auto* e : {&j["added_tokens_decoder"][std::to_string(bos)], &j["added_tokens_decoder"][std::to_string(eos)]})
    e->erase("id");
  j["bos_token"] = kBos;
  j["eos_token"] = kEos;
  j["clean_up_tokenization_spaces"] = false;
  j["model_max_length"] = max_len;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  return j;
}

}  // namespace

std::string builtin_tokenizer_corpus() {
  return std::string(reinterpret_cast<const char*>(kCorpus), sizeof kCorpus);
}

namespace {
uint64_t tensor_key(uint64_t seed, const std::string& name) { return splitmix64(seed ^ splitmix64(fnv1a64(name))); }
double normal_at(uint64_t key, uint64_t index) {
  double sum = 0.0;
  for (uint64_t k = 0; k < 4; ++k) {
    const uint64_t r = splitmix64(key + 4 * index + k);
    sum += static_cast<double>(r >> 11) * 0x1.0p-53 - 0.5;  // uniform in [-0.5, 0.5), exact
  }
  return sum * 1.7320508075688772;  // variance 4/12 -> 1
}
}  // namespace

double make_model_normal(uint64_t seed, const std::string& name, uint64_t index) {
  return normal_at(tensor_key(seed, name), index);
}

DType parse_make_model_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return DType::BF16;
  if (s == "fp32" || s == "f32" || s == "float32" || s == "F32") return DType::F32;
  if (s == "fp8" || s == "f8_e4m3" || s == "F8_E4M3") return DType::F8_E4M3;
  SHARDLM_FAIL("make-model: unsupported dtype '" << s << "' (supported: bf16, fp32, fp8)");
}

namespace {

using R = HfTensorDecl::Role;

void add_swiglu(std::vector<HfTensorDecl>* out, const std::string& p, const char* gate, const char* up,
                const char* down, int64_t H, int64_t I, bool bias) {
  out->push_back({p + gate + ".weight", {I, H}, R::kProjection});
  if (bias) out->push_back({p + gate + ".bias", {I}, R::kBias});
  out->push_back({p + up + ".weight", {I, H}, R::kProjection});
  if (bias) out->push_back({p + up + ".bias", {I}, R::kBias});
  out->push_back({p + down + ".weight", {H, I}, R::kProjection});
  if (bias) out->push_back({p + down + ".bias", {H}, R::kBias});
}

void add_gqa(std::vector<HfTensorDecl>* out, const ModelSpec& s, const std::string& p) {
  const int64_t H = s.hidden_size, q = s.num_heads * s.head_dim, kv = s.num_kv_heads * s.head_dim;
  out->push_back({p + "self_attn.q_proj.weight", {q, H}, R::kProjection});
  if (s.attention_bias) out->push_back({p + "self_attn.q_proj.bias", {q}, R::kBias});
  out->push_back({p + "self_attn.k_proj.weight", {kv, H}, R::kProjection});
  if (s.attention_bias) out->push_back({p + "self_attn.k_proj.bias", {kv}, R::kBias});
  out->push_back({p + "self_attn.v_proj.weight", {kv, H}, R::kProjection});
  if (s.attention_bias) out->push_back({p + "self_attn.v_proj.bias", {kv}, R::kBias});
  out->push_back({p + "self_attn.o_proj.weight", {H, q}, R::kProjection});
  if (s.o_proj_bias) out->push_back({p + "self_attn.o_proj.bias", {H}, R::kBias});
  if (s.qk_norm) {
    out->push_back({p + "self_attn.q_norm.weight", {s.head_dim}, R::kNorm});
    out->push_back({p + "self_attn.k_norm.weight", {s.head_dim}, R::kNorm});
  }
}

void add_mla(std::vector<HfTensorDecl>* out, const ModelSpec& s, const std::string& p) {
  const MlaSpec& a = s.mla;
  const int64_t H = s.hidden_size, nh = s.num_heads;
  if (a.q_lora_rank > 0) {
    out->push_back({p + "self_attn.q_a_proj.weight", {a.q_lora_rank, H}, R::kProjection});
    out->push_back({p + "self_attn.q_a_layernorm.weight", {a.q_lora_rank}, R::kNorm});
    out->push_back({p + "self_attn.q_b_proj.weight", {nh * a.qk_head_dim(), a.q_lora_rank}, R::kProjection});
  } else {
    out->push_back({p + "self_attn.q_proj.weight", {nh * a.qk_head_dim(), H}, R::kProjection});
  }
  out->push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {a.kv_lora_rank + a.qk_rope_head_dim, H}, R::kProjection});
  out->push_back({p + "self_attn.kv_a_layernorm.weight", {a.kv_lora_rank}, R::kNorm});
  out->push_back({p + "self_attn.kv_b_proj.weight", {nh * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank},
                  R::kProjection});
  out->push_back({p + "self_attn.o_proj.weight", {H, nh * a.v_head_dim}, R::kProjection});
}

void add_moe(std::vector<HfTensorDecl>* out, const ModelSpec& s, const std::string& p) {
  const MoeSpec& m = s.moe;
  const int64_t H = s.hidden_size, E = m.num_experts, I = m.expert_intermediate;
  if (m.naming == MoeSpec::Naming::kMixtral) {
    out->push_back({p + "block_sparse_moe.gate.weight", {E, H}, R::kRouter});
    for (int64_t e = 0; e < E; ++e) {
      add_swiglu(out, p + "block_sparse_moe.experts." + std::to_string(e) + ".", "w1", "w3", "w2", H, I, false);
    }
    return;
  }
  out->push_back({p + "mlp.gate.weight", {E, H}, R::kRouter});
  if (m.score_correction_bias) out->push_back({p + "mlp.gate.e_score_correction_bias", {E}, R::kBias});
  for (int64_t e = 0; e < E; ++e) {
    add_swiglu(out, p + "mlp.experts." + std::to_string(e) + ".", "gate_proj", "up_proj", "down_proj", H, I, false);
  }
  if (m.shared_intermediate > 0) {
    const bool qwen = m.naming == MoeSpec::Naming::kQwen;
    add_swiglu(out, p + (qwen ? "mlp.shared_expert." : "mlp.shared_experts."), "gate_proj", "up_proj", "down_proj",
               H, m.shared_intermediate, false);
    if (m.shared_expert_gate) out->push_back({p + "mlp.shared_expert_gate.weight", {1, H}, R::kRouter});
  }
}

}  // namespace

std::vector<HfTensorDecl> hf_tensor_list(const ModelSpec& s) {
  const int64_t H = s.hidden_size, V = s.vocab_size;
  std::vector<HfTensorDecl> out;
  out.push_back({"model.embed_tokens.weight", {V, H}, R::kEmbedding});
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {H}, R::kNorm});
    if (s.mla.enabled()) {
      add_mla(&out, s, p);
    } else {
      add_gqa(&out, s, p);
    }
    out.push_back({p + "post_attention_layernorm.weight", {H}, R::kNorm});
    if (s.moe.layer_is_moe(l)) {
      add_moe(&out, s, p);
    } else {
      add_swiglu(&out, p + "mlp.", "gate_proj", "up_proj", "down_proj", H, s.intermediate_size, s.mlp_bias);
    }
  }
  out.push_back({"model.norm.weight", {H}, R::kNorm});
  if (!s.tie_word_embeddings) out.push_back({"lm_head.weight", {V, H}, R::kLmHead});
  return out;
}

void make_model(const MakeModelOptions& opts) {
  SHARDLM_CHECK(opts.dtype == DType::BF16 || opts.dtype == DType::F32 || opts.dtype == DType::F8_E4M3,
                "make-model: dtype must be bf16, fp32 or fp8, got " << dtype_name(opts.dtype));
  // fp8: projections in F8_E4M3 with 128 x 128 block scales, everything else in bf16, as
  // DeepSeek-V3 and Kimi K2 ship.
  const bool fp8 = opts.dtype == DType::F8_E4M3;
  const DType plain = fp8 ? DType::BF16 : opts.dtype;
  SHARDLM_CHECK(!opts.out_dir.empty(), "make-model: no output directory given");
  const std::string config_text = read_file(opts.config_path);
  ModelSpec in_spec = ModelSpec::parse(config_text, "", opts.config_path);  // validates before writing
  SHARDLM_CHECK(in_spec.vocab_size >= 258, opts.config_path << ": field 'vocab_size' (" << in_spec.vocab_size
                                                            << ") must be at least 258 for make-model's "
                                                               "byte-level tokenizer (256 bytes + 2 specials)");

  // Tokenizer first: its special-token ids go into the configs.
  const std::string corpus = opts.corpus_path.empty() ? builtin_tokenizer_corpus() : read_file(opts.corpus_path);
  const BpeModel bpe = train_byte_level_bpe(corpus, static_cast<size_t>(in_spec.vocab_size - 258));
  const int32_t bos = static_cast<int32_t>(bpe.tokens.size());
  const int32_t eos = bos + 1;

  ojson config;
  try {
    config = ojson::parse(config_text);
  } catch (const nlohmann::json::exception& e) {
    SHARDLM_FAIL(opts.config_path << ": not valid JSON: " << e.what());
  }
  const char* dtype_str = plain == DType::BF16 ? "bfloat16" : "float32";
  config["torch_dtype"] = dtype_str;
  if (config.contains("dtype")) config["dtype"] = dtype_str;
  if (fp8) {
    config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                     {"fmt", "e4m3"},
                                     {"quant_method", "fp8"},
                                     {"weight_block_size", ojson::array({kFp8Block, kFp8Block})}};
  } else {
    config.erase("quantization_config");
  }
  config["bos_token_id"] = bos;
  config["eos_token_id"] = eos;

  fs::create_directories(opts.out_dir);
  const fs::path out(opts.out_dir);
  const std::string config_out = config.dump(2) + "\n";
  const ModelSpec spec = ModelSpec::parse(config_out, "", (out / "config.json").string());
  write_file((out / "config.json").string(), config_out);
  ojson gen;
  gen["bos_token_id"] = bos;
  gen["eos_token_id"] = eos;
  write_file((out / "generation_config.json").string(), gen.dump(2) + "\n");
  write_file((out / "tokenizer.json").string(), tokenizer_json(bpe, bos, eos).dump(2) + "\n");
  write_file((out / "tokenizer_config.json").string(),
             tokenizer_config_json(bos, eos, spec.max_position_embeddings).dump(2) + "\n");

  // Weights, streamed tensor by tensor.
  const auto tensors = hf_tensor_list(spec);
  std::vector<SafetensorsTensorDecl> decls;
  auto quantised = [&](const HfTensorDecl& t) { return fp8 && t.role == HfTensorDecl::Role::kProjection; };
  auto blocks = [](int64_t n) { return (n + kFp8Block - 1) / kFp8Block; };
  for (const auto& t : tensors) {
    if (quantised(t)) {
      decls.push_back({t.name, DType::F8_E4M3, t.shape});
      decls.push_back({t.name + "_scale_inv", DType::F32, {blocks(t.shape[0]), blocks(t.shape[1])}});
    } else {
      decls.push_back({t.name, plain, t.shape});
    }
  }
  const std::string st_path = (out / "model.safetensors").string();
  SafetensorsStreamWriter w(st_path, std::move(decls));
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    const double stdev = init_std(t, spec);
    const double mean = t.role == HfTensorDecl::Role::kNorm ? 1.0 : 0.0;
    f32.resize(static_cast<size_t>(n));
    float* dst = f32.data();
    const uint64_t key = tensor_key(opts.seed, t.name);
    // Output rows of ids the tokenizer never produces (vocab_size beyond the trained vocabulary)
    // are scaled down so greedy decoding picks real tokens, as in a trained model.
    const bool output_rows = t.role == HfTensorDecl::Role::kLmHead ||
                             (t.role == HfTensorDecl::Role::kEmbedding && spec.tie_word_embeddings);
    const int64_t first_unused = output_rows ? static_cast<int64_t>(eos + 1) * spec.hidden_size : n;
#pragma omp parallel for schedule(static) if (n >= (1 << 18))
    for (int64_t i = 0; i < n; ++i) {
      const double scale = i >= first_unused ? 0.25 * stdev : stdev;
      dst[i] = static_cast<float>(mean + scale * normal_at(key, static_cast<uint64_t>(i)));
    }
    if (quantised(t)) {
      std::vector<uint8_t> q(f32.size());
      std::vector<float> scales(static_cast<size_t>(blocks(t.shape[0]) * blocks(t.shape[1])));
      quantize_fp8_block(f32.data(), t.shape[0], t.shape[1], kFp8Block, kFp8Block, q.data(), scales.data());
      w.write_next(q.data(), q.size());
      w.write_next(scales.data(), scales.size() * 4);
    } else if (plain == DType::F32) {
      w.write_next(f32.data(), f32.size() * 4);
    } else {
      b16.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) b16[i] = f32_to_bf16(f32[i]);
      w.write_next(b16.data(), b16.size() * 2);
    }
  }
  w.finish();
}

}  // namespace shardlm
