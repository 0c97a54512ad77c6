// Row slices are views into the mapping; column slices are read with pread into owned storage.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/make_model.h"
#include "model/tensor_slice.h"
#include "test_util.h"

namespace shardlm {
namespace {

TEST(TensorSlice, RowsAndColumnsEqualTheWholeTensor) {
  test::ScratchDir dir;
  make_model({std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/tiny-llama.json", dir.str(), DType::F32, 5, ""});
  auto ck = Checkpoint::open(dir.str());
  const TensorView& w = ck->get("model.layers.1.mlp.down_proj.weight", {64, 176});
  const auto* full = static_cast<const float*>(w.data);

  TensorView rows = slice_rows(w, 10, 5);
  EXPECT_EQ(rows.shape, (std::vector<int64_t>{5, 176}));
  EXPECT_EQ(rows.data, full + 10 * 176);  // a view, no copy
  EXPECT_EQ(rows.nbytes, 5u * 176 * 4);

  std::vector<uint8_t> storage;
  TensorView cols = slice_cols(w, 44, 44, &storage);
  EXPECT_EQ(cols.shape, (std::vector<int64_t>{64, 44}));
  ASSERT_EQ(storage.size(), 64u * 44 * 4);
  const auto* got = static_cast<const float*>(cols.data);
  for (int64_t r = 0; r < 64; ++r) {
    for (int64_t c = 0; c < 44; ++c) ASSERT_EQ(got[r * 44 + c], full[r * 176 + 44 + c]) << r << "," << c;
  }
  EXPECT_EQ(touch_pages(rows), rows.nbytes);
  // The whole tensor comes back unchanged, without a copy.
  EXPECT_EQ(slice_cols(w, 0, 176, &storage).data, w.data);
}

// A column slice of a row slice reads the rows' columns (the row slice moves its file offset); a
// column slice of bytes made in memory copies them from memory, not from the file.
TEST(TensorSlice, ColumnsOfARowSliceAndOfMemoryBytes) {
  test::ScratchDir dir;
  make_model({std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/tiny-llama.json", dir.str(), DType::F32, 5, ""});
  auto ck = Checkpoint::open(dir.str());
  const TensorView& w = ck->get("model.layers.1.mlp.down_proj.weight", {64, 176});
  const auto* full = static_cast<const float*>(w.data);
  std::vector<uint8_t> storage;
  const TensorView part = slice_cols(slice_rows(w, 10, 5), 44, 44, &storage);
  const auto* got = static_cast<const float*>(part.data);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 44; ++c) ASSERT_EQ(got[r * 44 + c], full[(10 + r) * 176 + 44 + c]) << r << "," << c;
  EXPECT_FALSE(part.file_backed);

  std::vector<float> doubled(static_cast<size_t>(w.numel()));
  for (size_t i = 0; i < doubled.size(); ++i) doubled[i] = 2 * full[i];
  TensorView mem = w;
  mem.data = doubled.data();
  mem.file_backed = false;
  std::vector<uint8_t> storage2;
  const auto* m = static_cast<const float*>(slice_cols(mem, 1, 3, &storage2).data);
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 3; ++c) ASSERT_EQ(m[r * 3 + c], 2 * full[r * 176 + 1 + c]) << r << "," << c;
}

TEST(TensorSlice, OutOfRangeNamesTheTensor) {
  test::ScratchDir dir;
  make_model({std::string(SHARDLM_SOURCE_DIR) + "/inputs/models/tiny-llama.json", dir.str(), DType::BF16, 5, ""});
  auto ck = Checkpoint::open(dir.str());
  const TensorView& w = ck->get("model.layers.0.self_attn.q_proj.weight");
  std::vector<uint8_t> storage;
  try {
    slice_cols(w, 60, 10, &storage);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << e.what();
  }
  test::expect_error([&] { slice_rows(w, 0, w.shape[0] + 1); }, {w.file, "'model.layers.0.self_attn.q_proj.weight'",
                                                                 "rows [0, " + std::to_string(w.shape[0] + 1)});
}

}  // namespace
}  // namespace shardlm
