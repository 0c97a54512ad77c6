// ModelSpec: everything shardlm needs from a Hugging Face config.json (+ generation_config.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3, kYarn };
  Kind kind = Kind::kNone;
  double factor = 1.0;                        // linear and llama3
  double low_freq_factor = 1.0;               // llama3
  double high_freq_factor = 4.0;              // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3 and yarn
  double beta_fast = 32.0, beta_slow = 1.0;         // yarn: the band of wavelengths interpolated
  double mscale = 0.0, mscale_all_dim = 0.0;        // yarn (DeepSeek): attention temperature terms (0: unset)
  double attention_factor = 0.0;                    // yarn: explicit cos/sin scale (0: derived)
  bool truncate = true;                             // yarn: round the correction range to whole dims
};

// Mixture-of-Experts feed-forward (Mixtral, Qwen2/3-MoE, DeepSeek-V3 / Kimi K2). Absent
// (num_experts 0) for dense models.
struct MoeSpec {
  enum class Scoring { kSoftmax, kSigmoid };
  // How the checkpoint names a layer's MoE tensors.
  enum class Naming {
    kMixtral,   // block_sparse_moe.gate, block_sparse_moe.experts.E.{w1,w3,w2}
    kQwen,      // mlp.gate, mlp.experts.E.{gate,up,down}_proj, mlp.shared_expert{,_gate}
    kDeepseek,  // mlp.gate (+ e_score_correction_bias), mlp.experts.E.*, mlp.shared_experts.*
  };
  int64_t num_experts = 0;          // routed experts; 0: no MoE layer
  int64_t experts_per_token = 0;    // num_experts_per_tok
  int64_t expert_intermediate = 0;  // moe_intermediate_size (Mixtral: intermediate_size)
  Scoring scoring = Scoring::kSoftmax;
  Naming naming = Naming::kMixtral;
  bool norm_topk_prob = true;        // renormalise the chosen experts' weights to sum to 1
  bool score_correction_bias = false;  // DeepSeek: e_score_correction_bias, for selection only
  int64_t n_group = 1, topk_group = 1;  // group-limited routing (DeepSeek-V3: 8 groups, best 4)
  double routed_scaling_factor = 1.0;
  int64_t shared_intermediate = 0;  // shared expert(s) intermediate size in all; 0: none
  bool shared_expert_gate = false;  // Qwen2-MoE: sigmoid(gate(x)) scales the shared expert
  // Which layers are MoE: l >= first_dense_layers, (l + 1) % sparse_step == 0, l not in
  // mlp_only_layers.
  int64_t first_dense_layers = 0;   // first_k_dense_replace
  int64_t sparse_step = 1;          // decoder_sparse_step
  std::vector<int64_t> mlp_only_layers;

  bool enabled() const { return num_experts > 0; }
  bool layer_is_moe(int64_t layer) const;
};

// Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2). Absent (kv_lora_rank 0) for GQA models.
struct MlaSpec {
  int64_t q_lora_rank = 0;   // 0: q_proj directly from the hidden state
  int64_t kv_lora_rank = 0;  // the compressed latent kept in the cache
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // the rope half of q/k is stored interleaved (HF rope_interleave)

  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Floats cached per token per layer: the latent and the shared rope key (576 for DeepSeek-V3).
  int64_t cache_width() const { return kv_lora_rank + qk_rope_head_dim; }
};

// FP8 block quantisation of the checkpoint (config quantization_config, DeepSeek-V3 / Kimi K2).
struct QuantSpec {
  bool fp8_block = false;                  // quant_method "fp8", fmt e4m3
  int64_t block_rows = 128, block_cols = 128;  // weight_block_size
};

struct ModelSpec {
  std::string architecture;  // config "architectures"[0], e.g. "LlamaForCausalLM"
  std::string model_type;    // config "model_type"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;           // num_hidden_layers
  int64_t num_heads = 0;            // num_attention_heads
  int64_t num_kv_heads = 0;         // num_key_value_heads (defaults to num_heads)
  int64_t head_dim = 0;             // config head_dim, else hidden_size / num_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (Qwen2 always does)
  bool o_proj_bias = false;     // o_proj bias (Llama's attention_bias covers o_proj too)
  bool mlp_bias = false;
  bool qk_norm = false;          // Qwen3: RMSNorm over each head of q and k before RoPE
  int64_t sliding_window = 0;    // 0: full attention
  // Per layer, 1 where it attends through the sliding window: every layer for Mistral, Mixtral and
  // Qwen3-MoE; for Qwen2/Qwen3 and Qwen2-MoE config.json's layer_types, else each one's rule over
  // max_window_layers. Empty when sliding_window is 0.
  std::vector<uint8_t> sliding_layers;
  std::string hidden_act = "silu";
  DType torch_dtype = DType::F32;
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;  // from config and generation_config, merged
  std::string config_hash;             // hex FNV-1a 64 of config.json bytes
  MoeSpec moe;
  MlaSpec mla;
  QuantSpec quant;

  // Reads DIR/config.json and, when present, DIR/generation_config.json. Throws Error naming the
  // file and the field on anything missing or inconsistent.
  static ModelSpec load(const std::string& dir);
  // Parses config.json text (generation config optional, may be empty).
  static ModelSpec parse(const std::string& config_json, const std::string& generation_config_json,
                         const std::string& origin);
  // Checks divisibility and ranges; throws naming the field.
  void validate(const std::string& origin) const;

  // num_key_value_heads when config.json has none: the field's default in each transformers 5.25
  // config class (LlamaConfig's is the number of attention heads; DeepSeek-V3's MLA does not read it).
  static int64_t default_num_kv_heads(const std::string& architecture, int64_t num_heads);
  // Architectures shardlm supports ("LlamaForCausalLM", ...).
  static const std::vector<std::string>& supported_architectures();
  // True when LAYER attends through the sliding window.
  bool layer_uses_sliding_window(int64_t layer) const {
    return sliding_window > 0 && layer >= 0 && layer < static_cast<int64_t>(sliding_layers.size()) &&
           sliding_layers[layer] != 0;
  }
};

}  // namespace shardlm
