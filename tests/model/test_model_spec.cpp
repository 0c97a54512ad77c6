#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/shared_data.h"
#include "core/error.h"
#include "model/model_spec.h"
#include "test_util.h"

namespace shardlm {
namespace {

std::string inputs(const std::string& name) { return std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" + name; }

ModelSpec parse_input(const std::string& name) {
  return ModelSpec::parse(test::read_file(inputs(name)), "", inputs(name));
}

// Expects fn to throw Error whose message holds every one of the needles.
using test::expect_error;

const char* kMinimalLlama = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
  "vocab_size": 1000})";

TEST(ModelSpec, Stories260K) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  ModelSpec s = ModelSpec::load(dir);
  EXPECT_EQ(s.architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.model_type, "llama");
  EXPECT_EQ(s.hidden_size, 64);
  EXPECT_EQ(s.intermediate_size, 172);
  EXPECT_EQ(s.num_layers, 5);
  EXPECT_EQ(s.num_heads, 8);
  EXPECT_EQ(s.num_kv_heads, 4);
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_EQ(s.vocab_size, 512);
  EXPECT_EQ(s.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(s.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(s.rope_theta, 10000.0);
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_FALSE(s.attention_bias);
  EXPECT_FALSE(s.o_proj_bias);
  EXPECT_FALSE(s.qk_norm);
  EXPECT_EQ(s.sliding_window, 0);
  EXPECT_EQ(s.torch_dtype, DType::F32);
  EXPECT_EQ(s.bos_token_id, 1);
  EXPECT_EQ(s.eos_token_ids, std::vector<int32_t>({2}));
  EXPECT_EQ(s.config_hash.size(), 16u);
}

TEST(ModelSpec, ConfigHashIsFnv1aOfTheBytes) {
  // FNV-1a 64 computed independently here.
  const std::string text = kMinimalLlama;
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  char want[17];
  std::snprintf(want, sizeof want, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(ModelSpec::parse(text, "", "x/config.json").config_hash, want);
  // A whitespace change is a different config file.
  EXPECT_NE(ModelSpec::parse(text + " ", "", "x/config.json").config_hash, want);
}

TEST(ModelSpec, TransformersDefaults) {
  ModelSpec s = ModelSpec::parse(kMinimalLlama, "", "m/config.json");
  EXPECT_EQ(s.num_kv_heads, 8);   // defaults to num_attention_heads
  EXPECT_EQ(s.head_dim, 32);      // hidden / heads
  EXPECT_EQ(s.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(s.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(s.rope_theta, 10000.0);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_EQ(s.hidden_act, "silu");
  EXPECT_EQ(s.bos_token_id, -1);
  EXPECT_TRUE(s.eos_token_ids.empty());

  // Qwen3 defaults head_dim to 128, not hidden / heads.
  std::string q3 = kMinimalLlama;
  q3.replace(q3.find("LlamaForCausalLM"), 16, "Qwen3ForCausalLM");
  q3.insert(q3.size() - 1, R"(, "num_key_value_heads": 8)");
  EXPECT_EQ(ModelSpec::parse(q3, "", "m/config.json").head_dim, 128);
  // num_key_value_heads: each config class's own default when absent (printed from transformers
  // 5.25 for 32 heads), the head count for Llama and when null.
  for (const auto& [arch, kv] : std::vector<std::pair<std::string, int64_t>>{
           {"LlamaForCausalLM", 32}, {"MistralForCausalLM", 8}, {"Qwen2ForCausalLM", 32}, {"Qwen3ForCausalLM", 32}}) {
    std::string t = kMinimalLlama;
    t.replace(t.find("LlamaForCausalLM"), 16, arch);
    t.replace(t.find("\"num_attention_heads\": 8"), 24, "\"num_attention_heads\": 32");
    EXPECT_EQ(ModelSpec::parse(t, "", "m/config.json").num_kv_heads, kv) << arch;
    t.insert(t.size() - 1, R"(, "num_key_value_heads": null)");
    EXPECT_EQ(ModelSpec::parse(t, "", "m/config.json").num_kv_heads, 32) << arch << ", null";
  }
  // Mistral defaults sliding_window to 4096 when the key is absent.
  std::string mi = kMinimalLlama;
  mi.replace(mi.find("LlamaForCausalLM"), 16, "MistralForCausalLM");
  EXPECT_EQ(ModelSpec::parse(mi, "", "m/config.json").sliding_window, 4096);
  // MixtralConfig's own defaults differ from the others': rms_norm_eps 1e-5, rope_theta 1e6.
  std::string mx = kMinimalLlama;
  mx.replace(mx.find("LlamaForCausalLM"), 16, "MixtralForCausalLM");
  mx.insert(mx.size() - 1, R"(, "num_local_experts": 4, "num_experts_per_tok": 2)");
  const ModelSpec mixtral = ModelSpec::parse(mx, "", "m/config.json");
  EXPECT_DOUBLE_EQ(mixtral.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(mixtral.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(ModelSpec::parse(mi, "", "m/config.json").rope_theta, 10000.0);
}

TEST(ModelSpec, TinyLlama) {
  ModelSpec s = parse_input("tiny-llama.json");
  EXPECT_EQ(s.architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.hidden_size, 64);
  EXPECT_EQ(s.num_layers, 4);
  EXPECT_EQ(s.num_heads, 4);
  EXPECT_EQ(s.num_kv_heads, 2);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(s.intermediate_size, 176);
  EXPECT_EQ(s.vocab_size, 512);
  EXPECT_EQ(s.max_position_embeddings, 1024);
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(s.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(s.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(s.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(s.rope_scaling.original_max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(s.rope_theta, 500000.0);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_EQ(s.torch_dtype, DType::BF16);
}

TEST(ModelSpec, TinyQwen2HasQkvBiasAndTiedEmbeddings) {
  ModelSpec s = parse_input("tiny-qwen2.json");
  EXPECT_EQ(s.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(s.attention_bias);
  EXPECT_FALSE(s.o_proj_bias);
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(s.sliding_window, 0);  // use_sliding_window false
  EXPECT_DOUBLE_EQ(s.rope_theta, 1e6);
}

TEST(ModelSpec, TinyQwen3HasQkNormAndExplicitHeadDim) {
  ModelSpec s = parse_input("tiny-qwen3.json");
  EXPECT_EQ(s.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(s.qk_norm);
  EXPECT_EQ(s.head_dim, 32);
  EXPECT_NE(s.head_dim, s.hidden_size / s.num_heads);
  EXPECT_FALSE(s.attention_bias);
  EXPECT_FALSE(s.o_proj_bias);
}

TEST(ModelSpec, TinyMistralSlidingWindow) {
  ModelSpec s = parse_input("tiny-mistral.json");
  EXPECT_EQ(s.architecture, "MistralForCausalLM");
  EXPECT_EQ(s.sliding_window, 64);
  EXPECT_TRUE(s.layer_uses_sliding_window(0));
  EXPECT_TRUE(s.layer_uses_sliding_window(3));
  EXPECT_FALSE(s.attention_bias);
}

TEST(ModelSpec, Bench1024) {
  ModelSpec s = parse_input("bench-1024.json");
  EXPECT_EQ(s.hidden_size, 1024);
  EXPECT_EQ(s.num_layers, 16);
  EXPECT_EQ(s.num_heads, 16);
  EXPECT_EQ(s.num_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.intermediate_size, 2816);
  EXPECT_EQ(s.vocab_size, 32000);
  EXPECT_EQ(s.max_position_embeddings, 4096);
  EXPECT_FALSE(s.tie_word_embeddings);
}

TEST(ModelSpec, BiasRulesPerArchitecture) {
  auto with = [](const char* arch, const char* extra) {
    std::string t = kMinimalLlama;
    t.replace(t.find("LlamaForCausalLM"), 16, arch);
    t.insert(t.size() - 1, std::string(", \"num_key_value_heads\": 8, ") + extra);
    return ModelSpec::parse(t, "", "m/config.json");
  };
  ModelSpec llama = with("LlamaForCausalLM", R"("attention_bias": true, "mlp_bias": true)");
  EXPECT_TRUE(llama.attention_bias);
  EXPECT_TRUE(llama.o_proj_bias);
  EXPECT_TRUE(llama.mlp_bias);
  ModelSpec qwen2 = with("Qwen2ForCausalLM", R"("attention_bias": false)");
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_FALSE(qwen2.o_proj_bias);
  ModelSpec qwen3 = with("Qwen3ForCausalLM", R"("attention_bias": true)");
  EXPECT_TRUE(qwen3.attention_bias);
  EXPECT_TRUE(qwen3.o_proj_bias);
  EXPECT_TRUE(qwen3.qk_norm);
  ModelSpec mistral = with("MistralForCausalLM", R"("attention_bias": true, "sliding_window": null)");
  EXPECT_FALSE(mistral.attention_bias);
  EXPECT_EQ(mistral.sliding_window, 0);
  ModelSpec qwen2_sw = with("Qwen2ForCausalLM",
                            R"("use_sliding_window": true, "sliding_window": 128, "max_window_layers": 1)");
  EXPECT_EQ(qwen2_sw.sliding_window, 128);
  EXPECT_FALSE(qwen2_sw.layer_uses_sliding_window(0));
  EXPECT_TRUE(qwen2_sw.layer_uses_sliding_window(1));
}

TEST(ModelSpec, RopeScalingVariants) {
  auto with = [](const char* extra) {
    std::string t = kMinimalLlama;
    t.insert(t.size() - 1, std::string(", ") + extra);
    return t;
  };
  ModelSpec lin = ModelSpec::parse(with(R"("rope_scaling": {"type": "linear", "factor": 2.0})"), "", "m/config.json");
  EXPECT_EQ(lin.rope_scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(lin.rope_scaling.factor, 2.0);
  ModelSpec none = ModelSpec::parse(with(R"("rope_scaling": null)"), "", "m/config.json");
  EXPECT_EQ(none.rope_scaling.kind, RopeScaling::Kind::kNone);
  // transformers v5 layout.
  ModelSpec v5 = ModelSpec::parse(
      with(R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
      "", "m/config.json");
  EXPECT_EQ(v5.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(v5.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(v5.rope_theta, 500000.0);
  // A null rope_scaling left beside v5's rope_parameters does not hide them.
  ModelSpec both = ModelSpec::parse(
      with(R"("rope_scaling": null, "rope_parameters": {"rope_type": "linear", "rope_theta": 20000.0, "factor": 4.0})"),
      "", "m/config.json");
  EXPECT_EQ(both.rope_scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(both.rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(both.rope_theta, 20000.0);
  // Both a top-level rope_theta and rope_parameters' own: rope_parameters' wins, as in transformers v5
  // (the top-level value is only its default).
  ModelSpec theta = ModelSpec::parse(
      with(R"("rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})"), "",
      "m/config.json");
  EXPECT_DOUBLE_EQ(theta.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(ModelSpec::parse(with(R"("rope_theta": 10000.0, "rope_parameters": {"rope_type": "default"})"), "",
                                    "m/config.json")
                       .rope_theta,
                   10000.0);
  // A rope_scaling object takes precedence.
  ModelSpec old = ModelSpec::parse(with(R"("rope_scaling": {"type": "linear", "factor": 2.0},
      "rope_parameters": {"rope_type": "linear", "factor": 4.0})"),
                                   "", "m/config.json");
  EXPECT_DOUBLE_EQ(old.rope_scaling.factor, 2.0);
  expect_error([&] { ModelSpec::parse(with(R"("rope_scaling": {"rope_type": 4})"), "", "m/config.json"); },
               {"m/config.json", "rope_scaling.rope_type' must be a string"});
  expect_error([&] { ModelSpec::parse(with(R"("partial_rotary_factor": 0.5)"), "", "m/config.json"); },
               {"m/config.json", "partial_rotary_factor", "not supported"});
  expect_error([&] { ModelSpec::parse(with(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"), "", "m/config.json"); },
               {"m/config.json", "rope_scaling", "yarn"});
  expect_error([&] { ModelSpec::parse(with(R"("rope_scaling": {"rope_type": "llama3", "factor": 4.0})"), "", "m/config.json"); },
               {"m/config.json", "rope_scaling.low_freq_factor"});
}

// What transformers 5.25 builds from configs that mix the 4.x and v5 layouts, printed from
// LlamaConfig(...).rope_parameters (and the llama3 init function for the top-level
// original_max_position_embeddings, which wins only when the model is built).
TEST(ModelSpec, RopeFieldsCompletedAsTransformersDoes) {
  auto parse = [](const char* extra) {
    std::string t = kMinimalLlama;
    t.insert(t.size() - 1, std::string(", \"max_position_embeddings\": 2048, ") + extra);
    return ModelSpec::parse(t, "", "m/config.json");
  };
  // rope_scaling replaces rope_parameters whole, its own rope_theta included.
  ModelSpec a =
      parse(R"("rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0})");
  EXPECT_DOUBLE_EQ(a.rope_theta, 50000.0);
  ModelSpec b = parse(R"("rope_theta": 500000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                         "rope_scaling": {"rope_type": "linear", "factor": 2.0})");
  EXPECT_EQ(b.rope_scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(b.rope_theta, 500000.0);
  // No type is the default RoPE; an empty rope_scaling hides nothing.
  EXPECT_EQ(parse(R"("rope_scaling": {"factor": 4.0})").rope_scaling.kind, RopeScaling::Kind::kNone);
  ModelSpec d = parse(R"("rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 4.0})");
  EXPECT_EQ(d.rope_scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(d.rope_scaling.factor, 4.0);
  // llama3's pretraining length: max_position_embeddings when absent; a top-level one wins.
  const char* llama3 = R"("rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0)";
  EXPECT_EQ(
      parse((std::string(R"("rope_scaling": {)") + llama3 + "}").c_str()).rope_scaling.original_max_position_embeddings,
      2048);
  EXPECT_EQ(parse((std::string(R"("original_max_position_embeddings": 512, "rope_scaling": {)") + llama3 +
                   R"(, "original_max_position_embeddings": 256})")
                      .c_str())
                .rope_scaling.original_max_position_embeddings,
            512);
}

TEST(ModelSpec, EosMergedWithGenerationConfig) {
  std::string t = kMinimalLlama;
  t.insert(t.size() - 1, R"(, "bos_token_id": 1, "eos_token_id": [2, 3])");
  ModelSpec s = ModelSpec::parse(t, R"({"bos_token_id": 5, "eos_token_id": [3, 7]})", "m/config.json");
  EXPECT_EQ(s.eos_token_ids, std::vector<int32_t>({2, 3, 7}));
  EXPECT_EQ(s.bos_token_id, 5);
  ModelSpec single = ModelSpec::parse(t, R"({"eos_token_id": 9})", "m/config.json");
  EXPECT_EQ(single.eos_token_ids, std::vector<int32_t>({2, 3, 9}));
  EXPECT_EQ(single.bos_token_id, 1);
  expect_error([&] { ModelSpec::parse(t, R"({"eos_token_id": "x"})", "m/config.json"); },
               {"m/generation_config.json", "eos_token_id"});
}

TEST(ModelSpec, DtypeField) {
  auto with = [](const char* extra) {
    std::string t = kMinimalLlama;
    t.insert(t.size() - 1, std::string(", ") + extra);
    return ModelSpec::parse(t, "", "m/config.json");
  };
  EXPECT_EQ(with(R"("torch_dtype": "bfloat16")").torch_dtype, DType::BF16);
  EXPECT_EQ(with(R"("torch_dtype": "float16")").torch_dtype, DType::F16);
  EXPECT_EQ(with(R"("dtype": "bfloat16")").torch_dtype, DType::BF16);
  expect_error([&] { with(R"("torch_dtype": "int4")"); }, {"m/config.json", "torch_dtype", "int4"});
}

TEST(ModelSpec, ErrorsNameFileAndField) {
  expect_error([] { ModelSpec::parse(R"({"architectures": ["GPT2LMHeadModel"], "hidden_size": 8})", "", "a/config.json"); },
               {"a/config.json", "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                "Qwen3ForCausalLM"});
  std::string t = kMinimalLlama;
  t.replace(t.find("\"hidden_size\": 256,"), 19, "");
  expect_error([&] { ModelSpec::parse(t, "", "b/config.json"); }, {"b/config.json", "hidden_size"});
  std::string kv = kMinimalLlama;
  kv.insert(kv.size() - 1, R"(, "num_key_value_heads": 3)");
  expect_error([&] { ModelSpec::parse(kv, "", "c/config.json"); }, {"c/config.json", "num_key_value_heads"});
  std::string neg = kMinimalLlama;
  neg.replace(neg.find("\"intermediate_size\": 512"), 24, "\"intermediate_size\": 0");
  expect_error([&] { ModelSpec::parse(neg, "", "d/config.json"); }, {"d/config.json", "intermediate_size"});
  std::string typ = kMinimalLlama;
  typ.replace(typ.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": \"two\"");
  expect_error([&] { ModelSpec::parse(typ, "", "e/config.json"); }, {"e/config.json", "num_hidden_layers"});
  expect_error([] { ModelSpec::parse("{not json", "", "f/config.json"); }, {"f/config.json", "JSON"});
  expect_error([] { ModelSpec::load("/nonexistent/model"); }, {"/nonexistent/model", "config.json"});
}

TEST(ModelSpec, ValidateRejectsBadSpecs) {
  ModelSpec s = ModelSpec::parse(kMinimalLlama, "", "m/config.json");
  s.num_layers = 0;
  expect_error([&] { s.validate("v/config.json"); }, {"v/config.json", "num_hidden_layers"});
  s = ModelSpec::parse(kMinimalLlama, "", "m/config.json");
  s.eos_token_ids = {5000};
  expect_error([&] { s.validate("v/config.json"); }, {"v/config.json", "eos_token_id"});
}

}  // namespace
}  // namespace shardlm
