// An fp8 KV cache's per-layer scales from the checkpoint (WeightLoader::kv_scales): vLLM's
// self_attn.k_scale / v_scale, the older kv_scale for both, 1 where there are none, and a clear
// error naming the file and tensor for a scale that is not one finite positive F32 or BF16 value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "arch/weight_loader.h"
#include "common/cli_runner.h"
#include "compute/backend.h"
#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/test_util.h"

namespace shardlm {
namespace {

struct Scalar {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// A checkpoint directory holding just these tensors.
std::string checkpoint_of(const std::string& tag, const std::vector<Scalar>& tensors) {
  const std::filesystem::path d = test::fresh_dir("kv-scales-" + tag);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<SafetensorsWriteItem> items;
  for (const Scalar& t : tensors) {
    bytes.emplace_back(t.values.size() * dtype_size(t.dtype));
    for (size_t i = 0; i < t.values.size(); ++i) {
      if (t.dtype == DType::BF16) {
        const uint16_t h = f32_to_bf16(t.values[i]);
        std::memcpy(bytes.back().data() + 2 * i, &h, 2);
      } else if (t.dtype == DType::I32) {
        const int32_t v = static_cast<int32_t>(t.values[i]);
        std::memcpy(bytes.back().data() + 4 * i, &v, 4);
      } else {
        std::memcpy(bytes.back().data() + 4 * i, &t.values[i], 4);
      }
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    items.push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape, bytes[i].data()});
  write_safetensors((d / "model.safetensors").string(), items);
  return d.string();
}

const std::string kL0 = "model.layers.0.self_attn.", kL1 = "model.layers.1.self_attn.",
                  kL2 = "model.layers.2.self_attn.";

TEST(KvScales, ReadFromTheCheckpointElseOne) {
  const std::string dir = checkpoint_of("good", {{kL0 + "k_scale", DType::F32, {}, {0.125f}},
                                                 {kL0 + "v_scale", DType::F32, {1}, {0.03f}},
                                                 {kL1 + "kv_scale", DType::BF16, {}, {0.5f}},
                                                 {kL2 + "kv_scale", DType::F32, {}, {2.0f}},
                                                 {kL2 + "v_scale", DType::F32, {}, {0.25f}}});
  auto ck = Checkpoint::open(dir);
  auto b = make_backend("cpu");
  WeightLoader w(*ck, *b);
  const auto s0 = w.kv_scales(kL0), s1 = w.kv_scales(kL1), s2 = w.kv_scales(kL2);
  EXPECT_EQ(s0.k, 0.125f);
  EXPECT_EQ(s0.v, 0.03f);
  EXPECT_EQ(s1.k, 0.5f);  // kv_scale serves both sides
  EXPECT_EQ(s1.v, 0.5f);
  EXPECT_EQ(s2.k, 2.0f);  // a side's own scale wins over kv_scale
  EXPECT_EQ(s2.v, 0.25f);
  const auto none = w.kv_scales("model.layers.3.self_attn.");
  EXPECT_EQ(none.k, 1.0f);
  EXPECT_EQ(none.v, 1.0f);
}

TEST(KvScales, ABadScaleNamesTheFileAndTensor) {
  struct Bad {
    Scalar t;
    std::string says;
  };
  const Bad bads[] = {
      {{kL0 + "k_scale", DType::F32, {}, {-0.5f}}, "not a finite positive number"},
      {{kL0 + "k_scale", DType::F32, {}, {0.0f}}, "not a finite positive number"},
      {{kL0 + "v_scale", DType::F32, {}, {std::numeric_limits<float>::quiet_NaN()}}, "not a finite positive number"},
      {{kL0 + "v_scale", DType::F32, {}, {std::numeric_limits<float>::infinity()}}, "not a finite positive number"},
      {{kL0 + "k_scale", DType::F32, {2}, {0.5f, 0.25f}}, "with 2 elements"},
      {{kL0 + "kv_scale", DType::I32, {}, {3.0f}}, "I32"},
  };
  int i = 0;
  for (const Bad& bad : bads) {
    const std::string dir = checkpoint_of("bad" + std::to_string(i++), {bad.t});
    auto ck = Checkpoint::open(dir);
    auto b = make_backend("cpu");
    WeightLoader w(*ck, *b);
    test::expect_error([&] { w.kv_scales(kL0); }, {"model.safetensors", bad.t.name, bad.says});
  }
}

}  // namespace
}  // namespace shardlm
