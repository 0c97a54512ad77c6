// KV cache calibration: the magnitudes a decoder records (Model::record_kv_magnitudes) are the
// largest |value| each layer hands its cache, checked against a backend that measures what
// kv_write / latent_cache_write receive (GQA, Qwen3's normed keys, MLA's latent row); recording
// keeps graphs off; the scales file (write_kv_scales) read back through Checkpoint::add_file
// replaces the checkpoint's scales and is what WeightLoader::kv_scales returns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "arch/model.h"
#include "arch/weight_loader.h"
#include "cli/kv_calibration.h"
#include "common/model_steps.h"
#include "common/recording_backend.h"
#include "common/test_dirs.h"
#include "common/tiny_model.h"
#include "compute/cpu_backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/model_spec.h"

namespace shardlm {
namespace {

float max_abs(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// The CPU backend, measuring each cache write: one call per layer per step, in layer order.
class MeasuringBackend final : public CpuBackend {
 public:
  void kv_write(const float* k, const float* v, int64_t T, const int64_t* slots, int64_t n_kv_heads, int64_t head_dim,
                int64_t block_size, const KvCacheRef& cache) override {
    writes.push_back({max_abs(k, T * n_kv_heads * head_dim), max_abs(v, T * n_kv_heads * head_dim)});
    CpuBackend::kv_write(k, v, T, slots, n_kv_heads, head_dim, block_size, cache);
  }
  void latent_cache_write(const float* latent, const float* k_rope, int64_t T, const int64_t* slots, int64_t kv_lora,
                          int64_t rope_dim, const KvCacheRef& cache) override {
    writes.push_back({std::max(max_abs(latent, T * kv_lora), max_abs(k_rope, T * rope_dim)), 0.0f});
    CpuBackend::latent_cache_write(latent, k_rope, T, slots, kv_lora, rope_dim, cache);
  }
  std::vector<std::pair<float, float>> writes;
};

void run_steps(Model& m) {
  test::prefill_then_decode(m, {{5, 9, 2, 7, 1, 30, 31}, {3, 3, 8}, {11, 4, 6, 2, 9, 10, 12, 40, 2}});
}

TEST(KvCalibration, RecordsWhatTheCacheIsGiven) {
  for (const char* config : {"tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3"}) {
    const std::string dir = test::tiny_model_dir(config, DType::F32, 9);
    const ModelSpec spec = ModelSpec::load(dir);
    auto ckpt = Checkpoint::open(dir);
    MeasuringBackend b;
    auto m = build_model(spec, *ckpt, b);
    EXPECT_TRUE(m->kv_magnitudes().empty()) << config << ": nothing recorded before record_kv_magnitudes";
    m->record_kv_magnitudes();
    run_steps(*m);
    const std::vector<float> got = m->kv_magnitudes();
    const auto L = static_cast<size_t>(spec.num_layers);
    ASSERT_EQ(got.size(), 2 * L) << config;
    ASSERT_EQ(b.writes.size(), 2 * L) << config << ": two steps, one write per layer each";
    std::vector<float> want(2 * L, 0.0f);
    for (size_t w = 0; w < b.writes.size(); ++w) {
      want[2 * (w % L)] = std::max(want[2 * (w % L)], b.writes[w].first);
      want[2 * (w % L) + 1] = std::max(want[2 * (w % L) + 1], b.writes[w].second);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << config << " layer " << i / 2 << (i % 2 ? " V" : " K");
      if (i % 2 == 0 || !spec.mla.enabled()) {
        EXPECT_GT(got[i], 0.0f) << config << " layer " << i / 2;
      }
    }
  }
}

TEST(KvCalibration, RecordingStepsRunEagerly) {
  const std::string dir = test::tiny_model_dir("tiny-llama", DType::F32, 9);
  const ModelSpec spec = ModelSpec::load(dir);
  auto ckpt = Checkpoint::open(dir);
  test::RecordingBackend rec;
  auto m = build_model(spec, *ckpt, rec);
  m->record_kv_magnitudes();
  EXPECT_EQ(m->enable_step_graphs(), "a KV cache calibration records every step eagerly");
  run_steps(*m);
  EXPECT_EQ(rec.captures(), 0);
}

// The scales file: k_scale (and v_scale where there is a V side) per layer, magnitude / 448, read
// back over the checkpoint's own scales; a layer that saw nothing is an error and writes nothing.
TEST(KvCalibration, ScalesFileReplacesTheCheckpointsScales) {
  const std::string dir = test::tiny_model_dir("tiny-llama", DType::F32, 9);
  const std::filesystem::path d = test::fresh_dir("kv-calibration");
  const std::string path = (d / "scales.safetensors").string();
  write_kv_scales(path, {448.0f, 224.0f, 44.8f, 0.0f});  // layer 1 without a V side
  auto ckpt = Checkpoint::open(dir);
  const size_t before = ckpt->names().size();
  ckpt->add_file(path);
  EXPECT_EQ(ckpt->names().size(), before + 3);
  CpuBackend b;
  WeightLoader w(*ckpt, b);
  const WeightLoader::KvScales l0 = w.kv_scales("model.layers.0.self_attn.");
  EXPECT_FLOAT_EQ(l0.k, 1.0f);
  EXPECT_FLOAT_EQ(l0.v, 0.5f);
  const WeightLoader::KvScales l1 = w.kv_scales("model.layers.1.self_attn.");
  EXPECT_FLOAT_EQ(l1.k, 0.1f);
  EXPECT_FLOAT_EQ(l1.v, 1.0f) << "no v_scale written: the default";
  // A second file replaces the first's tensors.
  const std::string again = (d / "again.safetensors").string();
  write_kv_scales(again, {896.0f, 448.0f, 44.8f, 0.0f});
  ckpt->add_file(again);
  EXPECT_FLOAT_EQ(WeightLoader(*ckpt, b).kv_scales("model.layers.0.self_attn.").k, 2.0f);

  const std::string none = (d / "none.safetensors").string();
  try {
    write_kv_scales(none, {1.0f, 1.0f, 0.0f, 0.0f});
    ADD_FAILURE() << "a layer without magnitudes was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 saw keys of largest magnitude 0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(none));
  try {
    ckpt->add_file((d / "missing.safetensors").string());
    ADD_FAILURE() << "a missing file was added";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors does not exist"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
