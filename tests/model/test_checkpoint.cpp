#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/shared_data.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace shardlm {
namespace {

using test::expect_error;

TEST(Checkpoint, Stories260K) {
  SHARDLM_REQUIRE_SHARED(dir, "models/stories260K");
  auto ck = Checkpoint::open(dir);
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  ASSERT_TRUE(ck->has(name));
  const TensorView& t = ck->get(name, {64, 64});
  EXPECT_EQ(t.dtype, DType::F32);
  EXPECT_EQ(t.nbytes, 64u * 64u * 4u);
  EXPECT_EQ(t.file, dir + "/model.safetensors");

  // Read the first float straight from the file bytes: header length, header JSON offsets.
  const std::string bytes = test::read_file(dir + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  const std::string header = bytes.substr(8, n);
  const size_t key = header.find("\"" + name + "\"");
  ASSERT_NE(key, std::string::npos);
  const size_t offs = header.find("data_offsets", key);
  const size_t lb = header.find('[', offs);
  const uint64_t begin = std::stoull(header.substr(lb + 1));
  float want;
  std::memcpy(&want, bytes.data() + 8 + n + begin, 4);
  EXPECT_EQ(static_cast<const float*>(t.data)[0], want);
  EXPECT_NE(want, 0.0f);

  EXPECT_TRUE(ck->has("model.embed_tokens.weight"));
  EXPECT_FALSE(ck->has("lm_head.weight"));  // tied
  EXPECT_EQ(ck->get("model.embed_tokens.weight").shape, std::vector<int64_t>({512, 64}));
}

TEST(Checkpoint, ShapeMismatchNamesFileTensorExpectedAndFound) {
  test::ScratchDir dir;
  std::vector<float> w(12, 0.5f);
  write_safetensors(dir.file("model.safetensors"), {{"layer.weight", DType::F32, {3, 4}, w.data()}});
  auto ck = Checkpoint::open(dir.str());
  expect_error([&] { ck->get("layer.weight", {4, 3}); },
               {dir.file("model.safetensors"), "'layer.weight'", "[3, 4]", "[4, 3]"});
  expect_error([&] { ck->get("missing.weight"); }, {dir.str(), "'missing.weight'"});
}

TEST(Checkpoint, ShardedIndex) {
  test::ScratchDir dir;
  std::vector<float> a(6, 1.0f), b(4, 2.0f);
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", DType::F32, {2, 3}, a.data()}});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"b", DType::F32, {4}, b.data()}});
  test::write_file(dir.file("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 40}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                 "b": "model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck->get("a", {2, 3}).file, dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(ck->get("b", {4}).file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_FLOAT_EQ(static_cast<const float*>(ck->get("b").data)[3], 2.0f);
  EXPECT_EQ(ck->total_bytes(), 40u);
}

TEST(Checkpoint, MissingShardIsNamed) {
  test::ScratchDir dir;
  std::vector<float> a(6, 1.0f);
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", DType::F32, {2, 3}, a.data()}});
  test::write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                 "b": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); },
               {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "'b'", "missing"});
}

TEST(Checkpoint, IndexListsTensorTheShardLacks) {
  test::ScratchDir dir;
  std::vector<float> a(6, 1.0f);
  write_safetensors(dir.file("s1.safetensors"), {{"a", DType::F32, {2, 3}, a.data()}});
  test::write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"'ghost'", "s1.safetensors"});
}

TEST(Checkpoint, NoWeightsInDirectory) {
  test::ScratchDir dir;
  expect_error([&] { Checkpoint::open(dir.str()); }, {dir.str(), "model.safetensors"});
  expect_error([&] { Checkpoint::open(dir.file("nope")); }, {dir.file("nope")});
}

TEST(Checkpoint, CorruptHeaderNamesFile) {
  test::ScratchDir dir;
  test::write_file(dir.file("model.safetensors"), std::string("\x05\0\0\0\0\0\0\0{oops", 13));
  expect_error([&] { Checkpoint::open(dir.str()); }, {dir.file("model.safetensors"), "JSON"});
}

}  // namespace
}  // namespace shardlm
