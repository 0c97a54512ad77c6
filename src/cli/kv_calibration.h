// KV cache calibration (shardlm run --kv-calibrate-out FILE): per-layer fp8 scales from the largest
// key and value magnitudes a run gave the cache, written as the tensors vLLM and llm-compressor
// name (model.layers.N.self_attn.k_scale / v_scale, F32 scalars). scale = amax / 448, e4m3fn's
// largest finite value: static per-tensor scales, the largest magnitude seen mapping to the top of
// the fp8 range. A later run reads them with --kv-scales FILE (Checkpoint::add_file), over the
// checkpoint's own.
#pragma once

#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace shardlm {

// The maximum over the world's ranks of each rank's Model::kv_magnitudes() ([num_layers x 2]),
// collective; world may be null (one rank). Every rank passes a vector of the same length.
std::vector<float> reduce_kv_magnitudes(Communicator* world, std::vector<float> local);

// Writes the scales of `magnitudes` ([num_layers x 2]) to a safetensors file: k_scale for every
// layer, v_scale for a layer with a V side. Throws naming the layer when one saw no value (no step
// ran a token through it), before writing anything.
void write_kv_scales(const std::string& path, const std::vector<float>& magnitudes);

}  // namespace shardlm
