// Rotary inverse frequencies for a head dimension, with the rope_scaling variants of config.json.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_spec.h"

namespace shardlm {

// [rotary_dim / 2] values: theta^(-2i/rotary_dim), adjusted for linear, llama3 or YaRN scaling the
// way Hugging Face's rope initialisation functions (modeling_rope_utils.py) compute them.
// rotary_dim is the number of rotated dimensions of a head: head_dim for GQA models,
// mla.qk_rope_head_dim for Multi-head Latent Attention.
std::vector<float> rope_inv_freq(const ModelSpec& spec, int64_t rotary_dim);
// The same over spec.head_dim.
std::vector<float> rope_inv_freq(const ModelSpec& spec);

// The multiplier Hugging Face applies to cos and sin (its `attention_factor` /
// `attention_scaling`): 1 except for YaRN, where it is
//   get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)  when mscale and mscale_all_dim
//                                                                    are both non-zero,
//   get_mscale(factor)                                                otherwise.
// (transformers also reads an explicit `attention_factor` key and infers `factor` from
// max_position_embeddings when absent; RopeScaling carries neither.)
double rope_attention_factor(const ModelSpec& spec);

// DeepSeek's yarn_get_mscale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double yarn_get_mscale(double scale, double mscale);

// The softmax scale of attention over qk_head_dim-wide heads: qk_head_dim^-0.5, times
// yarn_get_mscale(factor, mscale_all_dim)^2 when rope scaling is on and mscale_all_dim is non-zero
// (DeepSeek-V2/V3's correction, transformers' yarn_apply_mscale). Computed in double, as Python
// does, then rounded once to float.
float attention_softmax_scale(const ModelSpec& spec, int64_t qk_head_dim);

}  // namespace shardlm
