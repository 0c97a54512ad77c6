#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace shardlm {
namespace {

// Raw file: 8-byte little-endian length, header text, then DATA.
std::string raw_file(const std::string& header, const std::string& data, uint64_t len_override = 0) {
  uint64_t n = len_override ? len_override : header.size();
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + data;
}

SafetensorsHeader parse(const std::string& bytes, const std::string& file = "t/model.safetensors") {
  return parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size(), file);
}

using test::expect_error;

const std::string k16(16, '\x01');

TEST(Safetensors, ParsesValidHeader) {
  auto h = parse(raw_file(R"({"__metadata__": {"format": "pt"},
      "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
      "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
      "e": {"dtype": "I64", "shape": [0, 5], "data_offsets": [22, 22]}})",
                         std::string(22, 'x')));
  ASSERT_EQ(h.entries.size(), 3u);
  std::map<std::string, SafetensorsEntry> m;
  for (auto& e : h.entries) m[e.name] = e;
  EXPECT_EQ(m["a"].dtype, DType::F32);
  EXPECT_EQ(m["a"].shape, std::vector<int64_t>({2, 2}));
  EXPECT_EQ(m["b"].dtype, DType::BF16);
  EXPECT_EQ(m["b"].begin, 16u);
  EXPECT_EQ(m["b"].end, 22u);
  EXPECT_EQ(m["e"].shape, std::vector<int64_t>({0, 5}));
}

TEST(Safetensors, HugeHeaderLength) {
  expect_error([] { parse(raw_file("{}", k16, 200ull * 1000 * 1000)); }, {"t/model.safetensors", "100 MB"});
}

TEST(Safetensors, HeaderBeyondEndOfFile) {
  expect_error([] { parse(raw_file("{}", "", 4096)); }, {"t/model.safetensors", "past the end"});
  expect_error([] { parse(std::string("\x02\0\0", 3)); }, {"t/model.safetensors"});
}

TEST(Safetensors, NotJson) {
  expect_error([] { parse(raw_file("{\"a\": [1, 2", k16)); }, {"t/model.safetensors", "JSON"});
  expect_error([] { parse(raw_file("[1, 2]", k16)); }, {"t/model.safetensors", "object"});
}

TEST(Safetensors, UnknownDtype) {
  expect_error([] { parse(raw_file(R"({"w": {"dtype": "Q4_K", "shape": [4], "data_offsets": [0, 16]}})", k16)); },
               {"t/model.safetensors", "'w'", "Q4_K"});
}

TEST(Safetensors, OffsetsOutOfRange) {
  // Sizes agree with the shape, but the bytes are not in the file.
  expect_error([] { parse(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", k16)); },
               {"t/model.safetensors", "'w'", "[8, 24]"});
  expect_error([] { parse(raw_file(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [9, 8]}})", k16)); },
               {"t/model.safetensors", "'w'"});
  expect_error([] { parse(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [-1, 15]}})", k16)); },
               {"t/model.safetensors", "'w'", "data_offsets"});
}

TEST(Safetensors, OverlappingTensors) {
  expect_error([] {
    parse(raw_file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", k16));
  }, {"t/model.safetensors", "'a'", "'b'", "overlap"});
}

TEST(Safetensors, SizeMismatchWithShape) {
  expect_error([] { parse(raw_file(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}})", k16)); },
               {"t/model.safetensors", "'w'", "[2, 3]", "24"});
  expect_error([] { parse(raw_file(R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", k16)); },
               {"t/model.safetensors", "'w'", "shape"});
}

// A dtype of the format that shardlm does not read (here F64 and BOOL) does not reject the file:
// its bytes are checked like any other's, the checkpoint lists it, and reading it names the file,
// the tensor and the dtype. A name the format does not have stays an error (UnknownDtype).
TEST(Safetensors, UnreadDtypesLoadUntilRead) {
  test::ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  test::write_file(path, raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                      "buf": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]},
                                      "mask": {"dtype": "BOOL", "shape": [0], "data_offsets": [16, 16]}})",
                                  k16));
  auto ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck->get("w", {2}).dtype, DType::F32);
  EXPECT_TRUE(ck->has("buf"));
  EXPECT_TRUE(ck->has("mask"));
  EXPECT_EQ(ck->names(), std::vector<std::string>({"w"}));
  expect_error([&] { ck->get("buf"); }, {path, "'buf'", "dtype F64", "does not read"});
  expect_error([&] { ck->get("mask", {0}); }, {path, "'mask'", "dtype BOOL"});
  // Its size is still checked against its shape.
  expect_error([] { parse(raw_file(R"({"d": {"dtype": "F64", "shape": [3], "data_offsets": [0, 16]}})", k16)); },
               {"'d'", "needs 24"});
}

// As the reference reader (safetensors 0.8 refuses each of these): the tensors tile the data section
// with no gap and nothing after the last, and no name is given twice (JSON would keep the last).
TEST(Safetensors, TensorsTileTheDataSectionAndNamesAreUnique) {
  expect_error(
      [] {
        parse(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                       k16));
      },
      {"t/model.safetensors", "'b' starts at byte 8", "[4, 8) no tensor holds"});
  expect_error([] { parse(raw_file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})", k16)); },
               {"t/model.safetensors", "end at byte 12", "16 bytes"});
  expect_error(
      [] {
        parse(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                       k16));
      },
      {"t/model.safetensors", "'a' appears twice"});
  // A key named twice inside an entry is not a tensor named twice.
  EXPECT_EQ(parse(raw_file(R"({"__metadata__": {"k": "1"}, "a": {"dtype": "F32", "shape": [4],
                              "data_offsets": [0, 16]}, "b": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]}})",
                           k16))
                .entries.size(),
            2u);
}

// F4 and F6 pack elements below a byte: a file holding them opens (its tensors are unread, as F64);
// a shape whose bits are no whole number of bytes, or whose element count overflows 63 bits even
// with a zero after it, is refused.
TEST(Safetensors, SubByteDtypesAndHugeShapes) {
  auto h = parse(raw_file(R"({"w": {"dtype": "F4", "shape": [4, 4], "data_offsets": [0, 8]},
                             "v": {"dtype": "F6_E2M3", "shape": [4, 2], "data_offsets": [8, 14]},
                             "u": {"dtype": "F32", "shape": [0], "data_offsets": [14, 14]},
                             "p": {"dtype": "U8", "shape": [2], "data_offsets": [14, 16]}})",
                          k16));
  ASSERT_EQ(h.entries.size(), 4u);
  expect_error([] { parse(raw_file(R"({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", "xx")); },
               {"'w'", "not a whole number of bytes"});
  expect_error(
      [] {
        parse(raw_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}})", ""));
      },
      {"'w'", "too large"});
}

// A tensor shardlm does not read still counts for the duplicate check across shards.
TEST(Safetensors, UnreadTensorInTwoShardsIsADuplicate) {
  test::ScratchDir dir;
  test::write_file(dir.file("a.safetensors"),
                   raw_file(R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", k16));
  test::write_file(dir.file("b.safetensors"), raw_file(R"({"y": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "x": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]}})",
                                                       k16));
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.str()); }, {"tensor 'x'", "a.safetensors", "b.safetensors"});
}

TEST(Safetensors, TruncatedFileThroughCheckpoint) {
  test::ScratchDir dir;
  std::vector<float> a(8, 1.0f), b(1000, 2.0f);
  write_safetensors(dir.file("model.safetensors"),
                    {{"small", DType::F32, {8}, a.data()}, {"big.weight", DType::F32, {10, 100}, b.data()}});
  std::string bytes = test::read_file(dir.file("model.safetensors"));
  test::write_file(dir.file("model.safetensors"), bytes.substr(0, bytes.size() - 100));
  expect_error([&] { Checkpoint::open(dir.str()); }, {dir.file("model.safetensors"), "'big.weight'", "truncated"});
}

TEST(Safetensors, WriterRoundTrip) {
  test::ScratchDir dir;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<uint16_t> b = {f32_to_bf16(0.5f), f32_to_bf16(-1.0f), f32_to_bf16(2.0f)};
  const std::string path = dir.file("model.safetensors");
  write_safetensors(path, {{"x.weight", DType::F32, {2, 3}, a.data()}, {"y", DType::BF16, {3}, b.data()}});
  const std::string bytes = test::read_file(path);
  auto h = parse(bytes, path);
  EXPECT_EQ(h.data_offset % 8, 0u);  // header padded so data is aligned
  ASSERT_EQ(h.entries.size(), 2u);
  auto ck = Checkpoint::open(dir.str());
  const auto& x = ck->get("x.weight", {2, 3});
  EXPECT_EQ(x.dtype, DType::F32);
  EXPECT_EQ(std::memcmp(x.data, a.data(), 24), 0);
  const auto& y = ck->get("y", {3});
  EXPECT_EQ(y.dtype, DType::BF16);
  EXPECT_FLOAT_EQ(bf16_to_f32(static_cast<const uint16_t*>(y.data)[1]), -1.0f);
  EXPECT_EQ(ck->total_bytes(), 24u + 6u);
  EXPECT_EQ(ck->names(), std::vector<std::string>({"x.weight", "y"}));

  // The streaming writer checks sizes and counts.
  SafetensorsStreamWriter w(dir.file("s.safetensors"), {{"a", DType::F32, {2}}, {"b", DType::F32, {1}}});
  expect_error([&] { w.write_next(a.data(), 4); }, {"s.safetensors", "'a'"});
  w.write_next(a.data(), 8);
  expect_error([&] { w.finish(); }, {"s.safetensors", "1 of 2"});
}

}  // namespace
}  // namespace shardlm
