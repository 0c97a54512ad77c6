#include "arch/rope_freqs.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardlm {

namespace {

// YaRN (transformers' _compute_yarn_parameters; the ramp bounds are rounded unless truncate is
// false): dimensions whose wavelength
// makes fewer than beta_slow rotations over the original context are interpolated (divided by
// factor), those making more than beta_fast rotations extrapolated (kept), with a linear ramp in
// between. The ramp bounds are computed in double and the blend in fp32, as torch does.
void apply_yarn(const RopeScaling& rs, double base, int64_t dim, std::vector<float>& inv) {
  SHARDLM_CHECK(rs.factor > 0, "rope_scaling yarn: factor must be positive, got " << rs.factor);
  const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
  const double beta_fast = rs.beta_fast != 0 ? rs.beta_fast : 32.0;  // Python: `or 32`
  const double beta_slow = rs.beta_slow != 0 ? rs.beta_slow : 1.0;   // Python: `or 1`
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(old_ctx / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
  };
  double low = correction_dim(beta_fast);
  double high = correction_dim(beta_slow);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoids a zero-width ramp
  const float lo = static_cast<float>(low);
  const float span = static_cast<float>(high - low);
  const float factor = static_cast<float>(rs.factor);
  for (size_t i = 0; i < inv.size(); ++i) {
    // inv[i] holds 1 / pos_freq, pos_freq = base^(2i/dim) in fp32; recompute pos_freq exactly.
    const float expo = static_cast<float>(2 * static_cast<int64_t>(i)) / static_cast<float>(dim);
    const float pos_freq = std::pow(static_cast<float>(base), expo);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelSpec& spec) { return rope_inv_freq(spec, spec.head_dim); }

std::vector<float> rope_inv_freq(const ModelSpec& spec, int64_t rotary_dim) {
  SHARDLM_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rope: rotary dimension must be positive and even, got "
                                                           << rotary_dim);
  const int64_t half = rotary_dim / 2;
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    // Hugging Face computes the exponent 2i/d in fp32 and the power in fp32; keep that rounding.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(spec.rope_theta), expo);
  }
  const RopeScaling& rs = spec.rope_scaling;
  if (rs.kind == RopeScaling::Kind::kLinear) {
    for (auto& f : inv) f = static_cast<float>(f / rs.factor);
  } else if (rs.kind == RopeScaling::Kind::kLlama3) {
    // Wavelengths longer than old_ctx/low_freq_factor are divided by factor, shorter than
    // old_ctx/high_freq_factor kept, and the band between is interpolated smoothly. Each step in
    // fp32, as transformers' tensor ops with Python scalars round it (bit-identical for Llama 3.1's
    // settings; in double, 4 of 64 frequencies were 1 ulp off).
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const float low_wavelen = static_cast<float>(old_ctx / rs.low_freq_factor);
    const float high_wavelen = static_cast<float>(old_ctx / rs.high_freq_factor);
    const float two_pi = static_cast<float>(2.0 * M_PI), factor = static_cast<float>(rs.factor);
    const float old_f = static_cast<float>(old_ctx), low_f = static_cast<float>(rs.low_freq_factor);
    const float span = static_cast<float>(rs.high_freq_factor - rs.low_freq_factor);
    for (auto& f : inv) {
      const float wavelen = two_pi / f;
      if (wavelen > low_wavelen) {
        f = f / factor;
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (old_f / wavelen - low_f) / span;
        f = (1.0f - smooth) * f / factor + smooth * f;
      }
    }
  } else if (rs.kind == RopeScaling::Kind::kYarn) {
    apply_yarn(rs, spec.rope_theta, rotary_dim, inv);
  }
  return inv;
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double rope_attention_factor(const ModelSpec& spec) {
  const RopeScaling& rs = spec.rope_scaling;
  if (rs.kind != RopeScaling::Kind::kYarn) return 1.0;
  if (rs.attention_factor > 0) return rs.attention_factor;
  if (rs.mscale != 0 && rs.mscale_all_dim != 0)
    return yarn_get_mscale(rs.factor, rs.mscale) / yarn_get_mscale(rs.factor, rs.mscale_all_dim);
  return yarn_get_mscale(rs.factor, 1.0);
}

float attention_softmax_scale(const ModelSpec& spec, int64_t qk_head_dim) {
  double scale = std::pow(static_cast<double>(qk_head_dim), -0.5);
  const RopeScaling& rs = spec.rope_scaling;
  if (rs.kind != RopeScaling::Kind::kNone && rs.mscale_all_dim != 0) {
    const double m = yarn_get_mscale(rs.factor, rs.mscale_all_dim);
    scale = scale * m * m;
  }
  return static_cast<float>(scale);
}

}  // namespace shardlm
