// shardlm plan: parameter and byte counts against public figures, MLA KV bytes, fit / no-fit on
// H200 nodes, per-rank splits, layout errors, and the --json output of the binary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_runner.h"
#include "core/error.h"
#include "plan/gpu_specs.h"
#include "plan/layout_plan.h"
#include "plan/model_footprint.h"

namespace shardlm::plan {
namespace {

std::string cfg(const std::string& rel) { return std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" + rel; }
ModelFootprint deepseek() { return ModelFootprint::load(cfg("configs/deepseek-v3.json")); }
ModelFootprint kimi() { return ModelFootprint::load(cfg("configs/kimi-k2.json")); }
const GpuSpec& h200() { return gpu_spec("h200"); }

PlanOptions opts(WeightDtype d) {
  PlanOptions o;
  o.dtype = d;
  return o;
}

LayoutPlan plan_default(const ModelFootprint& m, int nodes, WeightDtype d) {
  Layout l{nodes, 8, 0, 0, 0, 0};
  return plan_layout(m, h200(), default_layout(m, h200(), l, opts(d)), opts(d));
}

void expect_within(double got, double want, double rel) {
  EXPECT_NEAR(got / want, 1.0, rel) << "got " << got << ", want " << want << " within " << rel * 100 << "%";
}

// Public: DeepSeek-V3 has 671B parameters, 685B with the MTP module (the HF checkpoint).
// The CUDA runtime's device names to the datasheets: the SXM parts the table holds, and nothing
// for the form factors (or the emulated device) whose ceilings are not those.
TEST(PlanGpuSpecs, DeviceNamesMatchOnlyTheirDatasheet) {
  auto spec = [](const char* device) {
    const plan::GpuSpec* s = plan::datasheet_spec(device);
    return s ? s->name : std::string("none");
  };
  EXPECT_EQ(spec("NVIDIA H200"), "h200");
  EXPECT_EQ(spec("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(spec("nvidia h100"), "h100");
  EXPECT_EQ(spec("NVIDIA H100 PCIe"), "none");
  EXPECT_EQ(spec("NVIDIA H100 NVL"), "none");
  EXPECT_EQ(spec("NVIDIA H200 NVL"), "none");
  EXPECT_EQ(spec("NVIDIA GH200 480GB"), "none");
  EXPECT_EQ(spec("NVIDIA A100-SXM4-80GB"), "none");
  EXPECT_EQ(spec("host emulation of an sm_90 device"), "none");
}

TEST(PlanFootprint, DeepSeekV3ParamsMatchPublicFigures) {
  ModelFootprint m = deepseek();
  EXPECT_TRUE(m.mla);
  EXPECT_EQ(m.moe_layers, 58);
  expect_within(double(m.params()), 671e9, 0.01);                   // 671.03e9
  expect_within(double(m.params() + m.mtp_params()), 685e9, 0.01);  // 684.49e9
  expect_within(double(m.active_params_per_token()), 37e9, 0.03);   // "37B activated" (36.6e9 + embedding)
  // fp8 as shipped: ~673 GB without the MTP layer (the repo, MTP included, is ~688 GB).
  expect_within(m.bytes(WeightDtype::Fp8), 673e9, 0.01);
  expect_within(m.bytes(WeightDtype::Bf16), 1.342e12, 0.01);  // 2 bytes x 671e9
}

// Public: Kimi K2 has 1.03T parameters (HF model card; "1T total"), ~1.03 TB of fp8 safetensors.
TEST(PlanFootprint, KimiK2ParamsAndBytesMatchPublicFigures) {
  ModelFootprint m = kimi();
  EXPECT_EQ(m.n_routed_experts, 384);
  EXPECT_EQ(m.moe_layers, 60);
  EXPECT_EQ(m.mtp_params(), 0);
  expect_within(double(m.params()), 1.03e12, 0.01);                 // 1.0264e12
  expect_within(double(m.active_params_per_token()), 32e9, 0.03);  // "32B activated"
  expect_within(m.bytes(WeightDtype::Fp8), 1.03e12, 0.02);          // 1.0292e12
  // fp32 block scales: one per 128x128 block of every fp8 matrix.
  expect_within(m.scale_bytes(WeightDtype::Fp8), 4.0 * 1.0235e12 / (128 * 128), 0.01);
}

// Public figures for other MoE families parsed from their config.json keys.
TEST(PlanFootprint, MixtralAndQwenMoe) {
  nlohmann::json mixtral = {{"architectures", {"MixtralForCausalLM"}}, {"model_type", "mixtral"},
                            {"hidden_size", 4096}, {"intermediate_size", 14336}, {"num_hidden_layers", 32},
                            {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"vocab_size", 32000},
                            {"num_local_experts", 8}, {"num_experts_per_tok", 2}};
  ModelFootprint mx = ModelFootprint::from_config(mixtral, "mixtral");
  expect_within(double(mx.params()), 46.7e9, 0.01);                // Mixtral-8x7B: 46.7B total
  expect_within(double(mx.active_params_per_token()), 12.9e9, 0.02);  // 12.9B active
  nlohmann::json qwen = {{"architectures", {"Qwen2MoeForCausalLM"}}, {"model_type", "qwen2_moe"},
                         {"hidden_size", 2048}, {"intermediate_size", 5632}, {"num_hidden_layers", 24},
                         {"num_attention_heads", 16}, {"num_key_value_heads", 16}, {"vocab_size", 151936},
                         {"num_experts", 60}, {"num_experts_per_tok", 4}, {"moe_intermediate_size", 1408},
                         {"shared_expert_intermediate_size", 5632}, {"decoder_sparse_step", 1}};
  ModelFootprint q = ModelFootprint::from_config(qwen, "qwen1.5-moe");
  expect_within(double(q.params()), 14.3e9, 0.01);  // Qwen1.5-MoE-A2.7B: 14.3B total
}

// Malformed configs fail with the field named, not a division by zero or a JSON type error; a
// JSON null reads as the field's default; head_dim defaults as the loader's ModelSpec does.
TEST(PlanFootprint, MalformedFieldsAreNamedAndDefaultsFollowTheLoader) {
  const nlohmann::json base = {{"architectures", {"LlamaForCausalLM"}},
                               {"hidden_size", 256},
                               {"intermediate_size", 512},
                               {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},
                               {"vocab_size", 1000}};
  auto fails = [&](nlohmann::json c, const char* field) {
    try {
      (void)ModelFootprint::from_config(c, "m");
      ADD_FAILURE() << "no error for " << c.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  nlohmann::json c = base;
  c["num_key_value_heads"] = 0;
  fails(c, "num_key_value_heads");
  c = base;
  c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {0, 128}}};
  fails(c, "weight_block_size");
  c["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "static"}};
  fails(c, "per-tensor fp8 is not supported");
  c = base;
  c["tie_word_embeddings"] = "yes";
  fails(c, "tie_word_embeddings");
  c = base;
  c["tie_word_embeddings"] = nullptr;
  c["model_type"] = nullptr;
  c["attention_bias"] = nullptr;
  EXPECT_FALSE(ModelFootprint::from_config(c, "m").tied_embeddings);
  EXPECT_EQ(ModelFootprint::from_config(base, "m").head_dim, 64);  // hidden / heads
  c = base;
  c["architectures"] = {"Qwen3ForCausalLM"};
  EXPECT_EQ(ModelFootprint::from_config(c, "m").head_dim, 128);  // Qwen3Config's default
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  EXPECT_EQ(ModelFootprint::from_config(c, "m").head_dim, 64);  // Qwen3MoeConfig has none
  // num_key_value_heads absent: the config class's default, as the loader takes it.
  EXPECT_EQ(ModelFootprint::from_config(c, "m").kv_heads, 4);  // Qwen3MoeConfig's
  c["architectures"] = {"MistralForCausalLM"};
  EXPECT_EQ(ModelFootprint::from_config(c, "m").kv_heads, 8);
  EXPECT_EQ(ModelFootprint::from_config(base, "m").kv_heads, 4);  // Llama: the head count
  // DeepSeek-V3: every layer from first_k_dense_replace on is MoE, as the loader builds it;
  // moe_layer_freq (0 here, which divided by zero) is read by neither.
  c = base;
  c["architectures"] = {"DeepseekV3ForCausalLM"};
  c["num_hidden_layers"] = 6;
  c["n_routed_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["moe_intermediate_size"] = 64;
  c["first_k_dense_replace"] = 1;
  for (int freq : {0, 2}) {
    c["moe_layer_freq"] = freq;
    EXPECT_EQ(ModelFootprint::from_config(c, "m").moe_layers, 5) << "moe_layer_freq " << freq;
  }
  // q_lora_rank as the loader reads it: absent is transformers' 1536, null a plain q_proj.
  c["kv_lora_rank"] = 32;
  c["qk_nope_head_dim"] = 16;
  c["qk_rope_head_dim"] = 8;
  c["v_head_dim"] = 16;
  EXPECT_EQ(ModelFootprint::from_config(c, "m").q_lora_rank, 1536);
  c["q_lora_rank"] = nullptr;
  EXPECT_EQ(ModelFootprint::from_config(c, "m").q_lora_rank, 0);
  // Qwen2-MoE's q/k/v biases unless qkv_bias is false: 2 layers x (4 + 2 x 4) heads x 64.
  nlohmann::json q = base;
  q["architectures"] = {"Qwen2MoeForCausalLM"};
  q["model_type"] = "qwen2_moe";
  q["num_key_value_heads"] = 4;
  const int64_t with_bias = ModelFootprint::from_config(q, "m").params();
  q["qkv_bias"] = false;
  EXPECT_EQ(with_bias - ModelFootprint::from_config(q, "m").params(), 2 * (4 + 2 * 4) * 64);
}

TEST(PlanKv, DeepSeekV3MlaCacheIs70272BytesPerTokenInBf16) {
  ModelFootprint m = deepseek();
  EXPECT_EQ(m.kv_values_per_token_per_layer(), 576);  // kv_lora_rank 512 + qk_rope_head_dim 64
  for (int tp : {1, 8}) {
    LayoutPlan p = plan_layout(m, h200(), {1, 8, tp, 1, 8 / tp, 0}, opts(WeightDtype::Fp8));
    EXPECT_EQ(p.kv_bytes_per_token, 70272);       // 576 x 2 B x 61 layers
    EXPECT_EQ(p.kv_bytes_per_token_rank, 70272);  // the latent is replicated over tp, not split
  }
  PlanOptions o = opts(WeightDtype::Fp8);
  o.kv_dtype = WeightDtype::Fp8;
  EXPECT_EQ(plan_layout(m, h200(), {1, 8, 8, 1, 1, 0}, o).kv_bytes_per_token, 35136);
  // pp splits layers: 61 over 2 stages -> 31 on the heavier one.
  EXPECT_EQ(plan_layout(m, h200(), {1, 8, 4, 2, 1, 0}, opts(WeightDtype::Fp8)).kv_bytes_per_token_rank, 576 * 2 * 31);
}

TEST(PlanKv, GqaHeadsSplitByTp) {
  ModelFootprint m = ModelFootprint::load(cfg("bench-1024.json"));
  const PlanOptions o = opts(WeightDtype::Bf16);
  EXPECT_EQ(plan_layout(m, h200(), {1, 8, 1, 1, 1, 0}, o).kv_bytes_per_token_rank, 2 * 8 * 64 * 2 * 16);
  EXPECT_EQ(plan_layout(m, h200(), {1, 8, 2, 1, 1, 0}, o).kv_bytes_per_token_rank, 2 * 4 * 64 * 2 * 16);
  // tp 16 > 8 kv heads: each rank keeps one (replicated) head.
  EXPECT_EQ(plan_layout(m, h200(), {2, 8, 16, 1, 1, 0}, o).kv_bytes_per_token_rank, 2 * 1 * 64 * 2 * 16);
}

// 1.03 TB of fp8 weights on 8 x 141 GB = 1.128 TB: fits, with little room for KV.
TEST(PlanFit, KimiK2Fp8FitsOneNodeWithLittleKvRoom) {
  ModelFootprint m = kimi();
  LayoutPlan p = plan_default(m, 1, WeightDtype::Fp8);
  EXPECT_EQ(p.layout.tp * p.layout.dp * p.layout.pp, 8);
  EXPECT_EQ(p.layout.ep, 8);
  EXPECT_TRUE(p.fits) << p.why_not;
  expect_within(p.weight_bytes, 1.03e12 / 8, 0.02);
  EXPECT_GT(p.kv_capacity_tokens, 8192);
  EXPECT_LT(p.kv_capacity_tokens, 100000);  // a handful of 8k requests, not hundreds
  EXPECT_GT(p.free_bytes, 0);
  EXPECT_LT(p.free_bytes * 8, 50e9);  // tens of GB at most across the node
  EXPECT_LT(p.max_batch, 10);
  // With a 0.90 usable fraction it no longer fits: the margin really is that thin.
  PlanOptions o = opts(WeightDtype::Fp8);
  o.hbm_fraction = 0.90;
  EXPECT_FALSE(plan_layout(m, h200(), p.layout, o).fits);
}

TEST(PlanFit, KimiK2Bf16DoesNotFitOneNode) {
  ModelFootprint m = kimi();
  LayoutPlan p = plan_default(m, 1, WeightDtype::Bf16);
  EXPECT_FALSE(p.fits);
  EXPECT_GT(p.weight_bytes, h200().hbm_bytes);
  EXPECT_TRUE(suggest_layouts(m, h200(), 1, 8, opts(WeightDtype::Bf16)).empty());
}

// 1.34 TB of bf16 weights vs 8 x 141 GB = 1.128 TB (no) and 16 x 141 GB = 2.256 TB (yes).
TEST(PlanFit, DeepSeekV3Bf16NeedsTwoNodes) {
  ModelFootprint m = deepseek();
  LayoutPlan one = plan_default(m, 1, WeightDtype::Bf16);
  EXPECT_FALSE(one.fits);
  EXPECT_TRUE(suggest_layouts(m, h200(), 1, 8, opts(WeightDtype::Bf16)).empty());
  LayoutPlan two = plan_default(m, 2, WeightDtype::Bf16);
  EXPECT_TRUE(two.fits) << two.why_not;
  EXPECT_EQ(two.replicas, 1);
  EXPECT_EQ(two.layout.tp * two.layout.dp * two.layout.pp, 16);
  LayoutPlan explicit_ep = plan_layout(m, h200(), {2, 8, 8, 1, 2, 0}, opts(WeightDtype::Bf16));
  EXPECT_EQ(explicit_ep.layout.ep, 16);
  EXPECT_TRUE(explicit_ep.fits);
  EXPECT_GT(explicit_ep.ep_dispatch_bytes_per_token, 0);  // ep 16 > tp 8: all-to-all across the nodes
  // shardlm's exchange: per MoE layer a record per owner rank (min(top-k, ep) of them: 8) of H fp32
  // values and min(top-k, experts per rank) = 8 int32 slots; a result row per expert.
  const double layers = static_cast<double>(m.moe_layers), H = static_cast<double>(m.hidden);
  EXPECT_DOUBLE_EQ(explicit_ep.ep_dispatch_bytes_per_token, layers * 8 * (H * 4 + 8 * 4));
  EXPECT_DOUBLE_EQ(explicit_ep.ep_combine_bytes_per_token, layers * 8 * H * 4);
  PlanOptions bf16_wire = opts(WeightDtype::Bf16);
  bf16_wire.ep_wire = ExpertWire::kBf16;
  LayoutPlan halved = plan_layout(m, h200(), {2, 8, 8, 1, 2, 0}, bf16_wire);
  EXPECT_DOUBLE_EQ(halved.ep_dispatch_bytes_per_token, layers * 8 * (H * 2 + 8 * 4));
  EXPECT_DOUBLE_EQ(halved.ep_combine_bytes_per_token, explicit_ep.ep_combine_bytes_per_token / 2);
  EXPECT_LT(halved.decode_comm_s, explicit_ep.decode_comm_s);
  // fp8 dispatch: a byte a value and an fp32 scale per 128 of them (7168 = 56 x 128); bf16 combine.
  PlanOptions fp8_wire = opts(WeightDtype::Bf16);
  fp8_wire.ep_wire = ExpertWire::kFp8;
  LayoutPlan quarter = plan_layout(m, h200(), {2, 8, 8, 1, 2, 0}, fp8_wire);
  ASSERT_EQ(m.hidden % 128, 0);
  EXPECT_DOUBLE_EQ(quarter.ep_dispatch_bytes_per_token, layers * 8 * (H + H / 128 * 4 + 8 * 4));
  EXPECT_DOUBLE_EQ(quarter.ep_combine_bytes_per_token, halved.ep_combine_bytes_per_token);
  EXPECT_LT(quarter.decode_comm_s, halved.decode_comm_s);
  EXPECT_EQ(explicit_ep.ep_link, "nvlink+efa");
  EXPECT_FALSE(suggest_layouts(m, h200(), 2, 8, opts(WeightDtype::Bf16)).empty());
}

TEST(PlanFit, DeepSeekV3Fp8FitsOneNodeWithMoreRoomThanKimi) {
  LayoutPlan ds = plan_default(deepseek(), 1, WeightDtype::Fp8);
  LayoutPlan k2 = plan_default(kimi(), 1, WeightDtype::Fp8);
  EXPECT_TRUE(ds.fits);
  EXPECT_GT(ds.kv_capacity_tokens, 10 * k2.kv_capacity_tokens);
  EXPECT_GT(ds.free_bytes, 30e9);
  EXPECT_GT(ds.decode_tok_s, 0);
  EXPECT_GT(ds.prefill_tok_s, 0);
  auto sugg = suggest_layouts(deepseek(), h200(), 1, 8, opts(WeightDtype::Fp8));
  ASSERT_FALSE(sugg.empty());
  EXPECT_LE(sugg.size(), 5u);
  for (size_t i = 1; i < sugg.size(); ++i) EXPECT_GE(sugg[i - 1].decode_tok_s, sugg[i].decode_tok_s);
  for (const auto& s : sugg) EXPECT_TRUE(s.fits);
}

TEST(PlanLayout, DenseWeightsHalveFromTp1ToTp2) {
  ModelFootprint m = ModelFootprint::load(cfg("bench-1024.json"));
  EXPECT_FALSE(m.moe());
  const PlanOptions o = opts(WeightDtype::Bf16);
  LayoutPlan t1 = plan_layout(m, h200(), {1, 8, 1, 1, 1, 0}, o);
  LayoutPlan t2 = plan_layout(m, h200(), {1, 8, 2, 1, 1, 0}, o);
  EXPECT_DOUBLE_EQ(t1.weight_bytes, m.bytes(WeightDtype::Bf16));
  EXPECT_NEAR(t1.weight_bytes / t2.weight_bytes, 2.0, 0.01);  // norms are replicated: not exactly 2
  EXPECT_EQ(t1.replicas, 8);
  EXPECT_EQ(t2.replicas, 4);
  EXPECT_EQ(t2.tp_allreduces_per_token, 32);                  // 2 per layer
  EXPECT_DOUBLE_EQ(t2.tp_allreduce_bytes_per_token, 32.0 * 1024 * 4);  // the fp32 residual
}

std::string error_of(const ModelFootprint& m, Layout l) {
  try {
    plan_layout(m, h200(), l, opts(WeightDtype::Fp8));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PlanLayout, BadLayoutsNameTheNumbers) {
  ModelFootprint ds = deepseek();
  EXPECT_EQ(error_of(ds, {1, 8, 3, 1, 1, 0}),
            "layout tp 3 x pp 1 x dp 1 = 3 ranks does not divide the world of 8 ranks (1 nodes x 8 GPUs)");
  EXPECT_EQ(error_of(ds, {1, 6, 3, 1, 2, 0}), "tp 3 does not divide num_attention_heads 128");
  EXPECT_EQ(error_of(ds, {1, 8, 8, 1, 1, 3}), "ep 3 must be 1 or dp x tp = 1 x 8 = 8");
  // shardlm run takes ep = dp x tp or 1, nothing between.
  EXPECT_EQ(error_of(ds, {1, 8, 2, 1, 4, 4}), "ep 4 must be 1 or dp x tp = 4 x 2 = 8");
  EXPECT_EQ(error_of(ds, {16, 8, 1, 128, 1, 0}), "pp 128 exceeds num_hidden_layers 61");
  nlohmann::json mixtral = {{"hidden_size", 4096}, {"intermediate_size", 14336}, {"num_hidden_layers", 32},
                            {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"vocab_size", 32000},
                            {"num_local_experts", 8}, {"num_experts_per_tok", 2}};
  EXPECT_EQ(error_of(ModelFootprint::from_config(mixtral, "mixtral"), {2, 8, 8, 1, 2, 0}),
            "ep 16 does not divide n_routed_experts 8");
  ModelFootprint dense = ModelFootprint::load(cfg("bench-1024.json"));
  EXPECT_EQ(error_of(dense, {1, 8, 1, 1, 1, 8}), "ep 8 given but bench-1024 has no routed experts");
  nlohmann::json odd = mixtral;
  odd["vocab_size"] = 32001;
  EXPECT_EQ(error_of(ModelFootprint::from_config(odd, "odd"), {1, 8, 2, 1, 1, 1}),
            "tp 2 does not divide vocab_size 32001 (the embedding and LM head are split by vocabulary)");
}

// The planner lays a model out as shardlm run does (parallel/topology.cpp, arch/decoder.cpp).
TEST(PlanLayout, StagesAndShardsAsTheRunTakesThem) {
  // The remainder of the layers goes to the first stages: DeepSeek-V3's 61 over pp 2 is 31 + 30.
  const LayoutPlan ds = plan_layout(deepseek(), h200(), {2, 8, 8, 2, 1, 0}, opts(WeightDtype::Fp8));
  EXPECT_EQ(ds.stage_layer_counts, (std::vector<int64_t>{31, 30}));
  // With ep 1 each expert is split over tp: tp 8 holds an eighth of every expert, as ep 8 holds
  // every eighth expert whole.
  nlohmann::json mixtral = {{"hidden_size", 4096},       {"intermediate_size", 14336}, {"num_hidden_layers", 32},
                            {"num_attention_heads", 32}, {"num_key_value_heads", 8},   {"vocab_size", 32000},
                            {"num_local_experts", 8},    {"num_experts_per_tok", 2}};
  const ModelFootprint mx = ModelFootprint::from_config(mixtral, "mixtral");
  const LayoutPlan ep1 = plan_layout(mx, h200(), {1, 8, 8, 1, 1, 1}, opts(WeightDtype::Bf16));
  const LayoutPlan ep8 = plan_layout(mx, h200(), {1, 8, 8, 1, 1, 8}, opts(WeightDtype::Bf16));
  EXPECT_DOUBLE_EQ(ep1.expert_weight_bytes, ep8.expert_weight_bytes);
  EXPECT_NEAR(ep1.expert_weight_bytes, 8 * 3 * 4096.0 * 14336 * 2 * 32 / 8, 1e6);  // 11.3 GB a rank
  EXPECT_TRUE(ep1.fits);
  // A tied model's last stage loads its LM head as its own copy of the embedding: over pp 2 the
  // last stage holds it, over pp 1 the one stage holds both.
  nlohmann::json tied = mixtral;
  tied.erase("num_local_experts");
  tied.erase("num_experts_per_tok");
  nlohmann::json untied = tied;
  tied["tie_word_embeddings"] = true;
  const ModelFootprint t = ModelFootprint::from_config(tied, "tied"), u = ModelFootprint::from_config(untied, "untied");
  for (int pp : {1, 2}) {
    const LayoutPlan a = plan_layout(t, h200(), {1, 8, 1, pp, 1, 1}, opts(WeightDtype::Bf16));
    const LayoutPlan b = plan_layout(u, h200(), {1, 8, 1, pp, 1, 1}, opts(WeightDtype::Bf16));
    for (int s = 0; s < pp; ++s) EXPECT_DOUBLE_EQ(a.stage_weight_bytes[s], b.stage_weight_bytes[s]) << "pp " << pp;
  }
}

TEST(PlanCli, JsonOutputParsesAndHasTheFields) {
  test::Proc p = test::sh(test::shardlm_bin() + " plan --model " + cfg("configs/kimi-k2.json") +
                          " --nodes 1 --gpus-per-node 8 --gpu h200 --json");
  ASSERT_EQ(p.code, 0) << p.out;
  nlohmann::json j = nlohmann::json::parse(p.out);
  for (const char* k : {"weight_bytes", "kv_bytes_per_token", "kv_capacity_tokens", "fits", "estimates", "suggestions",
                        "comm_bytes_per_token", "layout", "model"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), 70272);
  EXPECT_GT(j["kv_capacity_tokens"].get<int64_t>(), 0);
  EXPECT_NEAR(j["model"]["params"].get<double>() / 1.03e12, 1.0, 0.01);
  EXPECT_GT(j["estimates"]["decode_tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(j["layout"]["tp"].get<int>(), 8);
  ASSERT_TRUE(j["suggestions"].is_array());
  ASSERT_FALSE(j["suggestions"].empty());
  EXPECT_TRUE(j["suggestions"][0]["fits"].get<bool>());

  test::Proc bf = test::sh(test::shardlm_bin() + " plan --model " + cfg("configs/deepseek-v3.json") +
                           " --nodes 1 --dtype bf16 --json");
  ASSERT_EQ(bf.code, 0) << bf.out;
  nlohmann::json jb = nlohmann::json::parse(bf.out);
  EXPECT_FALSE(jb["fits"].get<bool>());
  EXPECT_TRUE(jb["suggestions"].empty());
}

TEST(PlanCli, HumanOutputAndErrors) {
  test::Proc p = test::sh(test::shardlm_bin() + " plan --model " + cfg("bench-1024.json") + " --nodes 1");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("KV bytes/token"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("suggestions"), std::string::npos) << p.out;
  test::Proc bad = test::sh(test::shardlm_bin() + " plan --model " + cfg("configs/deepseek-v3.json") + " --tp 3");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("tp 3 x pp 1 x dp 1 = 3 ranks does not divide the world of 8 ranks"), std::string::npos)
      << bad.out;
}

}  // namespace
}  // namespace shardlm::plan
