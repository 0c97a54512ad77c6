#include "cli/kv_calibration.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "fp8_bits.h"
#include "model/safetensors.h"

namespace shardlm {

std::vector<float> reduce_kv_magnitudes(Communicator* world, std::vector<float> local) {
  if (world != nullptr && world->size() > 1) {
    world->all_reduce(local.data(), static_cast<int64_t>(local.size()), CommDType::kF32, ReduceOp::kMax);
  }
  return local;
}

void write_kv_scales(const std::string& path, const std::vector<float>& magnitudes) {
  const size_t layers = magnitudes.size() / 2;
  SHARDLM_CHECK(layers > 0 && magnitudes.size() == 2 * layers, "KV calibration: no layer magnitudes to write");
  std::vector<float> scales(magnitudes.size());  // sized once: the items point into it
  std::vector<SafetensorsWriteItem> items;
  for (size_t l = 0; l < layers; ++l) {
    const float k = magnitudes[2 * l], v = magnitudes[2 * l + 1];
    SHARDLM_CHECK(k > 0 && std::isfinite(k) && std::isfinite(v),
                  "KV calibration: layer " << l << " saw keys of largest magnitude " << k
                                           << " (no token reached it, or they were not finite); " << path
                                           << " not written");
    const std::string prefix = "model.layers." + std::to_string(l) + ".self_attn.";
    scales[2 * l] = k / fp8_bits::kMax;
    items.push_back({prefix + "k_scale", DType::F32, {}, &scales[2 * l]});
    if (v > 0) {
      scales[2 * l + 1] = v / fp8_bits::kMax;
      items.push_back({prefix + "v_scale", DType::F32, {}, &scales[2 * l + 1]});
    }
  }
  write_safetensors(path, items);
}

}  // namespace shardlm
