// Rotary inverse frequencies for a head dimension, with the rope_scaling variants of config.json.
#pragma once

#include <vector>

#include "model/model_spec.h"

namespace shardlm {

// [head_dim / 2] values: theta^(-2i/head_dim), adjusted for linear or llama3 scaling the way
// Hugging Face's rope initialisation functions do it.
std::vector<float> rope_inv_freq(const ModelSpec& spec);

}  // namespace shardlm
