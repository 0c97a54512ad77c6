#include "arch/rope_freqs.h"

#include <cmath>

namespace shardlm {

std::vector<float> rope_inv_freq(const ModelSpec& spec) {
  const int64_t half = spec.head_dim / 2;
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    // Hugging Face computes the exponent 2i/d in fp32 and the power in fp32; keep that rounding.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(spec.head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(spec.rope_theta), expo);
  }
  const RopeScaling& rs = spec.rope_scaling;
  if (rs.kind == RopeScaling::Kind::kLinear) {
    for (auto& f : inv) f = static_cast<float>(f / rs.factor);
  } else if (rs.kind == RopeScaling::Kind::kLlama3) {
    // Wavelengths longer than old_ctx/low_freq_factor are divided by factor, shorter than
    // old_ctx/high_freq_factor kept, and the band between is interpolated smoothly.
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rs.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / rs.factor + smooth * f);
      }
    }
  }
  return inv;
}

}  // namespace shardlm
