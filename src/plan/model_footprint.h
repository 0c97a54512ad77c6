// Parameter and byte counts of a transformer checkpoint, read straight from its config.json so that
// architectures ModelSpec does not load (MoE: Mixtral, Qwen2/Qwen3-MoE; MLA + MoE: DeepSeek-V3,
// Kimi K2) can be planned for. Every tensor of the architecture is one Piece, tagged with how the
// ranks of one pipeline stage divide it, so layout_plan can compute per-rank bytes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardlm::plan {

enum class WeightDtype { Fp8, Bf16 };
WeightDtype parse_weight_dtype(const std::string& s);  // "fp8" | "bf16"; Error otherwise
const char* to_string(WeightDtype d);

enum class Component { Embedding, Attention, DenseMlp, RoutedExperts, SharedExperts, Router, Norms, LmHead };
const char* to_string(Component c);
constexpr int kNumComponents = 8;

// How the ranks of one pipeline stage hold a tensor.
enum class Split {
  Tp,          // sharded over the tp ranks of an attention/MLP group, replicated over dp
  TpKv,        // GQA k/v projections: sharded over min(tp, kv_heads) (heads replicated beyond that)
  Replicated,  // every rank of the stage holds it (norms, router, MLA down-projections)
  Ep,          // routed experts: sharded over ep ranks
};

// How a tensor is stored.
enum class Storage {
  Matrix,  // a linear layer's weight: fp8 (1 byte + one fp32 scale per block) or bf16 at the chosen dtype
  Bf16,    // always bf16 (embedding, lm_head, norms, router gate, biases)
  Fp32,    // always fp32 (DeepSeek's e_score_correction_bias)
};

struct Piece {
  std::string name;  // "q_b_proj", "experts" ...
  Component component;
  Split split;
  Storage storage;
  int64_t params = 0;        // elements
  int64_t scale_params = 0;  // fp32 block scales (weight_scale_inv) when stored fp8
  int layer = 0;             // decoder layer 0..L-1; -1 embedding; L final norm + lm_head
  double bytes(WeightDtype d) const;
};

struct ModelFootprint {
  std::string name;          // file stem or directory name
  std::string architecture;  // architectures[0]
  std::string model_type;
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, intermediate = 0;
  bool tied_embeddings = false;

  // MLA (DeepSeek-V2/V3, Kimi K2); kv_lora_rank > 0 when the model uses it.
  bool mla = false;
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;

  // MoE; n_routed_experts > 0 when the model has experts.
  int64_t n_routed_experts = 0, experts_per_token = 0, moe_intermediate = 0;
  int64_t shared_intermediate = 0;  // total intermediate width of the shared expert(s), 0 if none
  std::vector<bool> layer_is_moe;    // per decoder layer
  int64_t moe_layers = 0;

  int64_t mtp_layers = 0;  // DeepSeek num_nextn_predict_layers: counted in mtp_params only
  bool native_fp8 = false;  // quantization_config says fp8 (the checkpoint's own dtype)
  int64_t block_rows = 128, block_cols = 128;  // fp8 weight_block_size

  std::vector<Piece> pieces;      // the model as served (no MTP)
  std::vector<Piece> mtp_pieces;  // multi-token-prediction modules (not loaded for plain decoding)

  static ModelFootprint from_config(const nlohmann::json& config, const std::string& name);
  // PATH is a config.json file or a model directory holding one.
  static ModelFootprint load(const std::string& path);

  bool moe() const { return n_routed_experts > 0; }
  int64_t params() const;      // pieces, scales excluded
  int64_t mtp_params() const;  // mtp_pieces
  double bytes(WeightDtype d) const;
  int64_t params_of(Component c) const;
  double bytes_of(Component c, WeightDtype d) const;
  double scale_bytes(WeightDtype d) const;  // fp32 block scales included in bytes()
  // Parameters one token multiplies through (routed experts: top-k of them), embedding excluded.
  int64_t active_params_per_token() const;
  // Values cached per token per layer: MLA kv_lora_rank + qk_rope_head_dim (the compressed latent
  // and the shared rope key, not per head); GQA 2 x kv_heads x head_dim.
  int64_t kv_values_per_token_per_layer() const;
  // FLOPs of attention scores + values per token per position of context, whole model.
  // decode: MLA with absorbed weights (per head: 2(kv_lora+rope) + 2 kv_lora); prefill: MLA
  // unabsorbed (2(nope+rope) + 2 v_head_dim). GQA: 4 x head_dim per head either way.
  double attention_flops_per_position(bool decode) const;
};

}  // namespace shardlm::plan
