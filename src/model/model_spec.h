// ModelSpec: everything shardlm needs from a Hugging Face config.json (+ generation_config.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3 };
  Kind kind = Kind::kNone;
  double factor = 1.0;                        // linear and llama3
  double low_freq_factor = 1.0;               // llama3
  double high_freq_factor = 4.0;              // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
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
  // First layer that uses the sliding window (Qwen2/Qwen3 apply it only to layers >=
  // max_window_layers; Mistral to every layer). Meaningless when sliding_window is 0.
  int64_t sliding_window_first_layer = 0;
  std::string hidden_act = "silu";
  DType torch_dtype = DType::F32;
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;  // from config and generation_config, merged
  std::string config_hash;             // hex FNV-1a 64 of config.json bytes

  // Reads DIR/config.json and, when present, DIR/generation_config.json. Throws Error naming the
  // file and the field on anything missing or inconsistent.
  static ModelSpec load(const std::string& dir);
  // Parses config.json text (generation config optional, may be empty).
  static ModelSpec parse(const std::string& config_json, const std::string& generation_config_json,
                         const std::string& origin);
  // Checks divisibility and ranges; throws naming the field.
  void validate(const std::string& origin) const;

  // Architectures shardlm supports ("LlamaForCausalLM", ...).
  static const std::vector<std::string>& supported_architectures();
  // True when LAYER attends through the sliding window.
  bool layer_uses_sliding_window(int64_t layer) const {
    return sliding_window > 0 && layer >= sliding_window_first_layer;
  }
};

}  // namespace shardlm
