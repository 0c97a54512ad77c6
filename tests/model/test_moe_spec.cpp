// ModelSpec for Mixture-of-Experts and MLA configs: the fields each architecture's config names,
// the layers that are MoE, YaRN, fp8 quantisation, and errors naming the field. Also make-model's
// MoE checkpoints: every tensor the architecture needs, projections in fp8 with block scales.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/make_model.h"
#include "model/model_spec.h"
#include "common/expect_error.h"
#include "test_util.h"

namespace shardlm {
namespace {

std::string inputs(const std::string& name) { return std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" + name; }

ModelSpec parse_input(const std::string& name) {
  return ModelSpec::parse(test::read_file(inputs(name)), "", inputs(name));
}

TEST(MoeSpec, Mixtral) {
  const ModelSpec s = parse_input("tiny-mixtral.json");
  EXPECT_EQ(s.moe.num_experts, 8);
  EXPECT_EQ(s.moe.experts_per_token, 2);
  EXPECT_EQ(s.moe.expert_intermediate, s.intermediate_size);
  EXPECT_EQ(s.moe.naming, MoeSpec::Naming::kMixtral);
  EXPECT_EQ(s.moe.scoring, MoeSpec::Scoring::kSoftmax);
  EXPECT_TRUE(s.moe.norm_topk_prob);
  EXPECT_EQ(s.moe.shared_intermediate, 0);
  for (int64_t l = 0; l < s.num_layers; ++l) EXPECT_TRUE(s.moe.layer_is_moe(l));
  EXPECT_FALSE(s.mla.enabled());
  EXPECT_EQ(s.sliding_window, 0);
}

TEST(MoeSpec, QwenMoe) {
  const ModelSpec q2 = parse_input("tiny-qwen2-moe.json");
  EXPECT_EQ(q2.moe.naming, MoeSpec::Naming::kQwen);
  EXPECT_EQ(q2.moe.shared_intermediate, 96);
  EXPECT_TRUE(q2.moe.shared_expert_gate);
  EXPECT_FALSE(q2.moe.norm_topk_prob);
  EXPECT_TRUE(q2.attention_bias);
  const ModelSpec q3 = parse_input("tiny-qwen3-moe.json");
  EXPECT_EQ(q3.moe.expert_intermediate, 48);
  EXPECT_EQ(q3.moe.shared_intermediate, 0);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_TRUE(q3.moe.layer_is_moe(0));
  EXPECT_FALSE(q3.moe.layer_is_moe(1));  // mlp_only_layers [1]
  EXPECT_TRUE(q3.moe.layer_is_moe(2));
  // Without head_dim, Qwen3-MoE takes hidden / heads (transformers' Qwen3MoeConfig has no default
  // of its own), where dense Qwen3 takes 128.
  std::string no_head_dim = test::read_file(inputs("tiny-qwen3-moe.json"));
  no_head_dim.erase(no_head_dim.find("\"head_dim\": 32,"), 15);
  EXPECT_EQ(ModelSpec::parse(no_head_dim, "", "q3moe.json").head_dim, 64 / 4);
  // decoder_sparse_step 2: layers 1, 3, ... are MoE.
  std::string text = test::read_file(inputs("tiny-qwen3-moe.json"));
  text.replace(text.find("\"decoder_sparse_step\": 1"), 24, "\"decoder_sparse_step\": 2");
  const ModelSpec step2 = ModelSpec::parse(text, "", "step2.json");
  EXPECT_FALSE(step2.moe.layer_is_moe(0));
  EXPECT_FALSE(step2.moe.layer_is_moe(1));  // also mlp_only
  EXPECT_FALSE(step2.moe.layer_is_moe(2));
  EXPECT_TRUE(step2.moe.layer_is_moe(3));
}

TEST(MoeSpec, DeepseekV3AndKimiK2) {
  const ModelSpec s = parse_input("tiny-deepseek-v3.json");
  EXPECT_EQ(s.moe.naming, MoeSpec::Naming::kDeepseek);
  EXPECT_EQ(s.moe.scoring, MoeSpec::Scoring::kSigmoid);
  EXPECT_TRUE(s.moe.score_correction_bias);
  EXPECT_EQ(s.moe.n_group, 4);
  EXPECT_EQ(s.moe.topk_group, 2);
  EXPECT_DOUBLE_EQ(s.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(s.moe.shared_intermediate, 64);  // n_shared_experts x moe_intermediate_size
  EXPECT_FALSE(s.moe.layer_is_moe(0));       // first_k_dense_replace 1
  EXPECT_TRUE(s.moe.layer_is_moe(1));
  EXPECT_EQ(s.mla.q_lora_rank, 96);
  EXPECT_EQ(s.mla.kv_lora_rank, 64);
  EXPECT_EQ(s.mla.qk_head_dim(), 48);
  EXPECT_EQ(s.mla.cache_width(), 80);
  EXPECT_EQ(s.head_dim, 16);  // RoPE runs over the rope part only
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kYarn);
  EXPECT_DOUBLE_EQ(s.rope_scaling.factor, 4.0);
  EXPECT_EQ(s.rope_scaling.original_max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(s.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_FALSE(s.quant.fp8_block);
  const ModelSpec k = parse_input("tiny-kimi-k2.json");
  EXPECT_EQ(k.moe.n_group, 1);
  EXPECT_EQ(k.moe.experts_per_token, 8);
  EXPECT_EQ(k.model_type, "kimi_k2");
}

// Fields transformers 5.25 reads that are easy to miss: Qwen2-MoE's qkv_bias switch, DeepSeek-V3's
// q_lora_rank default (1536 when absent, none when null), and a yarn factor of null (the context's
// extension, max_position_embeddings / original_max_position_embeddings).
TEST(MoeSpec, QkvBiasQLoraRankAndYarnFactorAsTransformersReadThem) {
  auto with = [](const std::string& name, const std::string& from, const std::string& to) {
    std::string text = test::read_file(inputs(name));
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    return ModelSpec::parse(text, "", name);
  };
  EXPECT_TRUE(parse_input("tiny-qwen2-moe.json").attention_bias);
  EXPECT_FALSE(with("tiny-qwen2-moe.json", "\"hidden_act\"", "\"qkv_bias\": false, \"hidden_act\"").attention_bias);
  EXPECT_EQ(with("tiny-deepseek-v3.json", "\"q_lora_rank\": 96,", "").mla.q_lora_rank, 1536);
  EXPECT_EQ(with("tiny-deepseek-v3.json", "\"q_lora_rank\": 96,", "\"q_lora_rank\": null,").mla.q_lora_rank, 0);
  EXPECT_DOUBLE_EQ(with("tiny-deepseek-v3.json", "\"factor\": 4.0,", "\"factor\": null,").rope_scaling.factor,
                   1024.0 / 256.0);
  EXPECT_DOUBLE_EQ(
      with("tiny-deepseek-v3.json", "\"max_position_embeddings\": 1024,", "\"max_position_embeddings\": 2048,")
          .rope_scaling.factor,
      4.0);
}

// Block-scaled fp8 is read; per-tensor fp8 (no weight_block_size: AutoFP8 / llm-compressor
// checkpoints with weight_scale and input_scale) is refused at the config, naming the scheme.
TEST(MoeSpec, Fp8QuantizationConfig) {
  std::string text = test::read_file(inputs("tiny-deepseek-v3.json"));
  auto with = [&](const std::string& quant) {
    std::string t = text;
    t.insert(t.rfind('}'), ", \"quantization_config\": " + quant);
    return ModelSpec::parse(t, "", "q/config.json");
  };
  const ModelSpec block = with(R"({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 64]})");
  EXPECT_TRUE(block.quant.fp8_block);
  EXPECT_EQ(block.quant.block_rows, 128);
  EXPECT_EQ(block.quant.block_cols, 64);
  for (const char* per_tensor :
       {R"({"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]})",
        R"({"quant_method": "fp8", "weight_block_size": null})"}) {
    test::expect_error([&] { with(per_tensor); },
                       {"q/config.json", "no weight_block_size", "per-tensor fp8", "not supported"});
  }
  test::expect_error([&] { with(R"({"quant_method": "fp8", "weight_block_size": [0, 128]})"); },
                     {"q/config.json", "weight_block_size' must be two positive integers"});
  test::expect_error([&] { with(R"({"quant_method": "awq"})"); }, {"q/config.json", "unsupported value 'awq'"});
}

// A DeepSeek-V3 config without the routing fields takes transformers' DeepseekV3Config defaults
// (n_group 8, topk_group 4, routed_scaling_factor 2.5, one shared expert, 3 dense layers first).
TEST(MoeSpec, DeepseekV3DefaultsAreTransformers) {
  std::string text = test::read_file(inputs("tiny-deepseek-v3.json"));
  for (const char* field : {"\"n_group\": 4,", "\"topk_group\": 2,", "\"n_shared_experts\": 1,",
                            "\"routed_scaling_factor\": 2.5,", "\"first_k_dense_replace\": 1,"}) {
    const size_t at = text.find(field);
    ASSERT_NE(at, std::string::npos) << field;
    text.erase(at, std::string(field).size());
  }
  const std::string experts = "\"n_routed_experts\": 16";
  text.replace(text.find(experts), experts.size(), "\"n_routed_experts\": 32");
  const ModelSpec s = ModelSpec::parse(text, "", "trimmed.json");
  EXPECT_EQ(s.moe.n_group, 8);
  EXPECT_EQ(s.moe.topk_group, 4);
  EXPECT_EQ(s.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(s.moe.shared_intermediate, s.moe.expert_intermediate);
  EXPECT_EQ(s.moe.first_dense_layers, 3);
}

TEST(MoeSpec, RealDeepseekV3CacheIs576PerToken) {
  const ModelSpec s = ModelSpec::parse(test::read_file(inputs("configs/deepseek-v3.json")), "", "deepseek-v3.json");
  EXPECT_EQ(s.mla.cache_width(), 576);
  EXPECT_EQ(s.moe.num_experts, 256);
  EXPECT_EQ(s.moe.n_group, 8);
  EXPECT_TRUE(s.quant.fp8_block);
  EXPECT_EQ(s.quant.block_rows, 128);
  EXPECT_EQ(s.quant.block_cols, 128);
  EXPECT_FALSE(s.moe.layer_is_moe(2));
  EXPECT_TRUE(s.moe.layer_is_moe(3));
  const ModelSpec k = ModelSpec::parse(test::read_file(inputs("configs/kimi-k2.json")), "", "kimi-k2.json");
  EXPECT_EQ(k.mla.cache_width(), 576);
  EXPECT_EQ(k.moe.num_experts, 384);
  EXPECT_EQ(k.moe.n_group, 1);
  EXPECT_EQ(k.num_heads, 64);
}

TEST(MoeSpec, ErrorsNameTheField) {
  std::string text = test::read_file(inputs("tiny-deepseek-v3.json"));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  test::expect_error([&] { ModelSpec::parse(with("\"n_group\": 4", "\"n_group\": 3"), "", "c.json"); },
                     {"c.json", "n_group", "16"});
  test::expect_error([&] { ModelSpec::parse(with("\"topk_group\": 2", "\"topk_group\": 5"), "", "c.json"); },
                     {"topk_group"});
  test::expect_error([&] { ModelSpec::parse(with("\"num_experts_per_tok\": 4", "\"num_experts_per_tok\": 17"), "", "c.json"); },
                     {"num_experts_per_tok"});
  test::expect_error([&] { ModelSpec::parse(with("\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"relu\""), "", "c.json"); },
                     {"scoring_func", "relu"});
  // DeepSeek-V3 routes by sigmoid scores with the correction bias only: DeepSeek-V2's routing
  // modes are refused, not run as something else.
  test::expect_error(
      [&] { ModelSpec::parse(with("\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\""), "", "c.json"); },
      {"c.json", "scoring_func", "softmax", "supported: sigmoid"});
  test::expect_error(
      [&] {
        ModelSpec::parse(with("\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"group_limited_greedy\""), "",
                         "c.json");
      },
      {"c.json", "topk_method", "group_limited_greedy", "supported: noaux_tc"});
  test::expect_error(
      [&] { ModelSpec::parse(with("\"n_routed_experts\": 16", "\"n_routed_experts\": 0"), "", "c.json"); },
      {"c.json", "'n_routed_experts'", "positive"});
  test::expect_error([&] { ModelSpec::parse(with("\"kv_lora_rank\": 64,", ""), "", "c.json"); }, {"kv_lora_rank"});
  test::expect_error(
      [&] { ModelSpec::parse(with("\"attention_bias\": false", "\"attention_bias\": true"), "", "c.json"); },
      {"attention_bias"});
  // YaRN is applied by the MLA block only.
  std::string llama = test::read_file(inputs("tiny-llama.json"));
  const size_t at = llama.find("\"rope_scaling\"");
  ASSERT_NE(at, std::string::npos);
  const size_t end = llama.find('}', at);
  llama.replace(at, end + 1 - at,
                "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 256}");
  test::expect_error([&] { ModelSpec::parse(llama, "", "llama.json"); }, {"llama.json", "rope_scaling", "yarn"});
}

// make-model's fp8 checkpoints: projections F8_E4M3 with [ceil(R/128), ceil(C/128)] F32 scales,
// routers, norms, biases and embeddings bf16, and the config says how.
TEST(MoeSpec, MakeModelFp8Checkpoint) {
  test::ScratchDir dir;
  make_model({inputs("tiny-deepseek-v3.json"), dir.str(), DType::F8_E4M3, 1, ""});
  const ModelSpec s = ModelSpec::load(dir.str());
  EXPECT_TRUE(s.quant.fp8_block);
  EXPECT_EQ(s.torch_dtype, DType::BF16);
  auto ck = Checkpoint::open(dir.str());
  int quantised = 0;
  for (const HfTensorDecl& t : hf_tensor_list(s)) {
    const TensorView& v = ck->get(t.name, t.shape);
    if (t.role == HfTensorDecl::Role::kProjection) {
      ++quantised;
      EXPECT_EQ(v.dtype, DType::F8_E4M3) << t.name;
      const TensorView& sc = ck->get(t.name + "_scale_inv");
      EXPECT_EQ(sc.dtype, DType::F32);
      EXPECT_EQ(sc.shape, (std::vector<int64_t>{(t.shape[0] + 127) / 128, (t.shape[1] + 127) / 128})) << t.name;
    } else {
      EXPECT_EQ(v.dtype, DType::BF16) << t.name;
      EXPECT_FALSE(ck->has(t.name + "_scale_inv")) << t.name;
    }
  }
  EXPECT_GT(quantised, 100);
  EXPECT_TRUE(ck->has("model.layers.1.mlp.gate.e_score_correction_bias"));
  EXPECT_TRUE(ck->has("model.layers.1.mlp.experts.15.down_proj.weight"));
  EXPECT_TRUE(ck->has("model.layers.1.mlp.shared_experts.gate_proj.weight"));
  EXPECT_TRUE(ck->has("model.layers.0.mlp.gate_proj.weight"));  // the dense first layer
  EXPECT_TRUE(ck->has("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"));
}

}  // namespace
}  // namespace shardlm
