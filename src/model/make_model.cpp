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
#include "model/safetensors.h"

namespace shardlm {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

const unsigned char kCorpus[] = {
#include "model/tokenizer_corpus.inc"
};

constexpr const char* kBos = "<|bos|>";
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
  SHARDLM_FAIL("make-model: unsupported dtype '" << s << "' (supported: bf16, fp32)");
}

std::vector<HfTensorDecl> hf_tensor_list(const ModelSpec& s) {
  using R = HfTensorDecl::Role;
  const int64_t H = s.hidden_size, I = s.intermediate_size, V = s.vocab_size;
  const int64_t q = s.num_heads * s.head_dim, kv = s.num_kv_heads * s.head_dim;
  std::vector<HfTensorDecl> out;
  out.push_back({"model.embed_tokens.weight", {V, H}, R::kEmbedding});
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {H}, R::kNorm});
    out.push_back({p + "self_attn.q_proj.weight", {q, H}, R::kProjection});
    if (s.attention_bias) out.push_back({p + "self_attn.q_proj.bias", {q}, R::kBias});
    out.push_back({p + "self_attn.k_proj.weight", {kv, H}, R::kProjection});
    if (s.attention_bias) out.push_back({p + "self_attn.k_proj.bias", {kv}, R::kBias});
    out.push_back({p + "self_attn.v_proj.weight", {kv, H}, R::kProjection});
    if (s.attention_bias) out.push_back({p + "self_attn.v_proj.bias", {kv}, R::kBias});
    out.push_back({p + "self_attn.o_proj.weight", {H, q}, R::kProjection});
    if (s.o_proj_bias) out.push_back({p + "self_attn.o_proj.bias", {H}, R::kBias});
    if (s.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {s.head_dim}, R::kNorm});
      out.push_back({p + "self_attn.k_norm.weight", {s.head_dim}, R::kNorm});
    }
    out.push_back({p + "post_attention_layernorm.weight", {H}, R::kNorm});
    out.push_back({p + "mlp.gate_proj.weight", {I, H}, R::kProjection});
    if (s.mlp_bias) out.push_back({p + "mlp.gate_proj.bias", {I}, R::kBias});
    out.push_back({p + "mlp.up_proj.weight", {I, H}, R::kProjection});
    if (s.mlp_bias) out.push_back({p + "mlp.up_proj.bias", {I}, R::kBias});
    out.push_back({p + "mlp.down_proj.weight", {H, I}, R::kProjection});
    if (s.mlp_bias) out.push_back({p + "mlp.down_proj.bias", {H}, R::kBias});
  }
  out.push_back({"model.norm.weight", {H}, R::kNorm});
  if (!s.tie_word_embeddings) out.push_back({"lm_head.weight", {V, H}, R::kLmHead});
  return out;
}

void make_model(const MakeModelOptions& opts) {
  SHARDLM_CHECK(opts.dtype == DType::BF16 || opts.dtype == DType::F32,
                "make-model: dtype must be bf16 or fp32, got " << dtype_name(opts.dtype));
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
  const char* dtype_str = opts.dtype == DType::BF16 ? "bfloat16" : "float32";
  config["torch_dtype"] = dtype_str;
  if (config.contains("dtype")) config["dtype"] = dtype_str;
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
  for (const auto& t : tensors) decls.push_back({t.name, opts.dtype, t.shape});
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
    if (opts.dtype == DType::F32) {
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
