// make-model: writes a random Hugging Face checkpoint directory (config.json, generation_config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json) for a config.json-style input file.
//
// Weights come from a counter-based generator keyed by (seed, tensor name, element index), so the
// output is byte-identical for a seed on every platform and whatever the thread count. Scales keep
// activations O(1) and make the logits far from uniform (std ~4), so greedy decoding is meaningful
// when two implementations are compared: projections std 1/sqrt(fan_in); untied embeddings std 1,
// tied ones and lm_head std 4/sqrt(hidden); norms 1 + 0.1 N(0,1); biases std 0.2. Output rows of
// ids beyond the trained tokenizer (e.g. bench-1024's vocab of 32000) are scaled by 0.25 so greedy
// decoding emits real tokens. The tokenizer is byte-level BPE trained by bpe_trainer.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_spec.h"

namespace shardlm {

struct MakeModelOptions {
  std::string config_path;      // an HF config.json-style file (e.g. inputs/models/tiny-llama.json)
  std::string out_dir;          // created when absent; existing files of the same names are replaced
  DType dtype = DType::BF16;    // BF16, F32 or F8_E4M3 (block-scaled projections, the rest BF16)
  uint64_t seed = 0;
  std::string corpus_path;      // tokenizer training text; empty: the built-in inputs/tokenizer_corpus.txt
};

// "bf16"/"bfloat16" -> BF16, "fp32"/"f32"/"float32" -> F32; throws Error otherwise.
DType parse_make_model_dtype(const std::string& s);

void make_model(const MakeModelOptions& opts);

// One tensor of a decoder checkpoint, in Hugging Face naming. Routers and gates are never
// quantised; projections are quantised in fp8 checkpoints.
struct HfTensorDecl {
  enum class Role { kEmbedding, kLmHead, kProjection, kRouter, kBias, kNorm };
  std::string name;
  std::vector<int64_t> shape;
  Role role;
};
// Every tensor a checkpoint of SPEC's architecture holds, in the order make-model writes them.
std::vector<HfTensorDecl> hf_tensor_list(const ModelSpec& spec);

// The built-in tokenizer training text (inputs/tokenizer_corpus.txt at build time).
std::string builtin_tokenizer_corpus();

// The random value make-model gives element INDEX of tensor NAME for SEED, before scaling: mean 0,
// variance 1 (sum of four uniforms; exact IEEE arithmetic, no libm).
double make_model_normal(uint64_t seed, const std::string& name, uint64_t index);

}  // namespace shardlm
