// Which layers attend through the sliding window, per architecture. Expected patterns are what
// transformers 5.25's configs build (layer_types, or the modeling code's use of sliding_window for
// every layer), printed from Python for these very fields.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model_spec.h"
#include "common/expect_error.h"
#include "test_util.h"

namespace shardlm {
namespace {

using json = nlohmann::json;

// inputs/models/NAME with six layers, the fields of PATCH set (a null one too) and DROP removed.
ModelSpec parse_patched(const std::string& name, const json& patch, const std::string& drop = "") {
  const std::string path = std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/" + name;
  json config = json::parse(test::read_file(path));
  config["num_hidden_layers"] = 6;
  for (const auto& [key, value] : patch.items()) config[key] = value;
  if (!drop.empty()) config.erase(drop);
  return ModelSpec::parse(config.dump(), "", "m/config.json");
}

// "S" for a sliding layer, "F" for a full one.
std::string pattern(const ModelSpec& s) {
  std::string out;
  for (int64_t l = 0; l < s.num_layers; ++l) out += s.layer_uses_sliding_window(l) ? 'S' : 'F';
  return out;
}

json sw(int64_t max_window_layers) {
  return {{"use_sliding_window", true}, {"sliding_window", 16}, {"max_window_layers", max_window_layers}};
}

TEST(SlidingWindowLayers, Qwen2AndQwen3SlideFromMaxWindowLayersOn) {
  EXPECT_EQ(pattern(parse_patched("tiny-qwen2.json", sw(2))), "FFSSSS");
  EXPECT_EQ(pattern(parse_patched("tiny-qwen3.json", sw(4))), "FFFFSS");
  EXPECT_EQ(parse_patched("tiny-qwen2.json", sw(2)).sliding_window, 16);
  // At or past the last layer none slides, and the window is dropped.
  EXPECT_EQ(parse_patched("tiny-qwen2.json", sw(6)).sliding_window, 0);
  json off = sw(2);
  off["use_sliding_window"] = false;
  EXPECT_EQ(pattern(parse_patched("tiny-qwen2.json", off)), "FFFFFF");
}

TEST(SlidingWindowLayers, Qwen2MoeSlidesEvenLayersBelowMaxWindowLayers) {
  EXPECT_EQ(pattern(parse_patched("tiny-qwen2-moe.json", sw(3))), "SFSFFF");
  json all = sw(3);
  all.erase("max_window_layers");  // 28 by default
  EXPECT_EQ(pattern(parse_patched("tiny-qwen2-moe.json", all, "max_window_layers")), "SFSFSF");
}

TEST(SlidingWindowLayers, Qwen3MoeSlidesEveryLayer) {
  EXPECT_EQ(pattern(parse_patched("tiny-qwen3-moe.json", sw(3))), "SSSSSS");
  json off = sw(3);
  off["use_sliding_window"] = false;
  EXPECT_EQ(pattern(parse_patched("tiny-qwen3-moe.json", off)), "FFFFFF");
}

TEST(SlidingWindowLayers, ExplicitLayerTypesWinOverTheRule) {
  json q2 = sw(2);
  q2["layer_types"] = {"sliding_attention", "full_attention",    "sliding_attention",
                       "full_attention",    "sliding_attention", "full_attention"};
  EXPECT_EQ(pattern(parse_patched("tiny-qwen2.json", q2)), "SFSFSF");
  json moe = sw(3);
  moe["layer_types"] = {"full_attention", "full_attention", "full_attention",
                        "full_attention", "full_attention", "sliding_attention"};
  EXPECT_EQ(pattern(parse_patched("tiny-qwen2-moe.json", moe)), "FFFFFS");
  // Without use_sliding_window transformers sets the window to None: its attention is then full
  // whatever layer_types says.
  q2["use_sliding_window"] = false;
  EXPECT_EQ(pattern(parse_patched("tiny-qwen2.json", q2)), "FFFFFF");
  // Mistral's modeling ignores layer_types: every layer slides.
  json mistral = {{"sliding_window", 16}, {"layer_types", q2["layer_types"]}};
  EXPECT_EQ(pattern(parse_patched("tiny-mistral.json", mistral)), "SSSSSS");
}

TEST(SlidingWindowLayers, MistralAndMixtralSlideEveryLayerWhenAWindowIsSet) {
  EXPECT_EQ(pattern(parse_patched("tiny-mistral.json", {{"sliding_window", 16}})), "SSSSSS");
  EXPECT_EQ(pattern(parse_patched("tiny-mistral.json", {{"sliding_window", nullptr}})), "FFFFFF");
  EXPECT_EQ(pattern(parse_patched("tiny-mistral.json", json::object(), "sliding_window")), "SSSSSS");  // 4096
  EXPECT_EQ(pattern(parse_patched("tiny-mixtral.json", json::object(), "sliding_window")), "FFFFFF");  // None
  EXPECT_EQ(pattern(parse_patched("tiny-mixtral.json", {{"sliding_window", 16}})), "SSSSSS");
  EXPECT_EQ(pattern(parse_patched("tiny-mixtral.json", {{"sliding_window", nullptr}})), "FFFFFF");
}

TEST(SlidingWindowLayers, BadLayerTypesNameTheField) {
  json few = sw(2);
  few["layer_types"] = {"full_attention", "sliding_attention"};
  test::expect_error([&] { parse_patched("tiny-qwen2.json", few); },
                     {"field 'layer_types' must list one type per layer (num_hidden_layers = 6), got 2 entries"});
  json chunked = sw(2);
  chunked["layer_types"] = {"full_attention", "full_attention", "chunked_attention",
                            "full_attention", "full_attention", "full_attention"};
  test::expect_error([&] { parse_patched("tiny-qwen2.json", chunked); },
                     {"field 'layer_types' entry 2 is \"chunked_attention\""});
  json negative = sw(2);
  negative["sliding_window"] = -4;
  test::expect_error([&] { parse_patched("tiny-qwen2.json", negative); },
                     {"field 'sliding_window' must be non-negative, got -4"});
}

}  // namespace
}  // namespace shardlm
