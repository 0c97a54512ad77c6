// kernels/cuda/bf16_grouped_gemm_mma (the experts' bf16 GEMMs on bf16 tensor cores in one launch)
// against the sum in double of the same bf16 products: each product is exact in fp32, so only the
// fp32 sums round, within n 2^-24 of sum |x w| for n = K + 16 terms in any order. Groups of one
// row, of a tile and one more, of several tiles, and empty; an N off the 128-output tile and a K
// off the 64-feature step; rows before the first group left alone. Its routed launch (tiles listed
// on the device from the groups' offsets) gives the listed launch's bits and leaves the rows past
// the groups alone. Both cores: mma.sync, and wgmma (bf16_grouped_gemm_wgmma.h) on an sm_90 GPU or
// the emulated runtime. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "bf16_bits.h"
#include "common/gpu.h"

#ifdef SHARDLM_HAVE_CUDA
#include "cuda/bf16_grouped_gemm_mma.h"
#include "cuda/device_buffer.h"
#endif

namespace shardlm {
namespace {

#ifdef SHARDLM_HAVE_CUDA
using test::DeviceBuffer;

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = bf16_bits::from_f32(nd(g));
  return v;
}

void check_groups(int64_t N, int64_t K, const std::vector<int64_t>& sizes, int64_t first,
                  cuda::GemmCore core = cuda::GemmCore::kMmaSync) {
  SCOPED_TRACE(::testing::Message() << (core == cuda::GemmCore::kWgmma ? "wgmma" : "mma.sync") << ", N " << N << ", K "
                                    << K << ", " << sizes.size() << " groups from row " << first);
  ASSERT_TRUE(cuda::bf16_grouped_gemm_mma_fits(N, K));
  std::vector<int64_t> off = {first};
  for (int64_t n : sizes) off.push_back(off.back() + n);
  const int64_t R = off.back(), G = static_cast<int64_t>(sizes.size());
  std::vector<std::vector<uint16_t>> w;
  std::vector<DeviceBuffer<uint16_t>> dw;
  for (int64_t g = 0; g < G; ++g) {
    w.push_back(random_bf16(static_cast<size_t>(N * K), 300 + static_cast<uint32_t>(g), 0.05f));
    dw.emplace_back(w.back());
  }
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(R * K), 7, 1.0f);
  std::vector<cuda::GemmTile> tiles;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t m0 = 0; m0 < sizes[g]; m0 += cuda::kBf16GemmTileRows)
      tiles.push_back({dw[g].get(), nullptr, off[g] + m0,
                       static_cast<int32_t>(std::min<int64_t>(cuda::kBf16GemmTileRows, sizes[g] - m0)), 0});
  const float sentinel = -4321.0f;
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<float> dy(std::vector<float>(static_cast<size_t>(R * N), sentinel));
  DeviceBuffer<cuda::GemmTile> dt(tiles);
  cuda::launch_bf16_grouped_gemm_mma(dx.get(), dt.get(), static_cast<int64_t>(tiles.size()), N, K, dy.get(), nullptr,
                                     core);
  test::cuda_sync("bf16_grouped_gemm_mma");
  const std::vector<float> y = dy.download();
  for (int64_t i = 0; i < first * N; ++i) ASSERT_EQ(y[i], sentinel) << "row " << i / N << " written";
  const double bound = static_cast<double>(K + 16) * std::ldexp(1.0, -24);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = off[g]; r < off[g + 1]; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double want = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = double(bf16_bits::to_f32(x[r * K + k])) * bf16_bits::to_f32(w[g][n * K + k]);
          want += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[r * N + n], want, bound * mag + 1e-30) << "group " << g << " row " << r << " output " << n;
      }

  // The routed launch from the same offsets on the device, over 7 rows more than the groups hold.
  const int64_t max_rows = R + 7;
  std::vector<uint16_t> x7(x);
  x7.resize(static_cast<size_t>(max_rows * K), bf16_bits::from_f32(1.0f));
  std::vector<cuda::RoutedWeight> table;
  for (const auto& b : dw) table.push_back({b.get(), nullptr});
  const std::vector<int32_t> off32(off.begin(), off.end());
  const int64_t max_tiles = cuda::bf16_routed_gemm_max_tiles(max_rows, G);
  DeviceBuffer<uint16_t> dx7(x7);
  DeviceBuffer<float> dy7(std::vector<float>(static_cast<size_t>(max_rows * N), sentinel));
  DeviceBuffer<int32_t> doff(off32), dcount(1);
  DeviceBuffer<cuda::RoutedWeight> dtable(table);
  DeviceBuffer<cuda::GemmTile> dtiles(static_cast<size_t>(max_tiles));
  cuda::launch_bf16_routed_gemm_mma(dx7.get(), max_rows, doff.get(), G, dtable.get(), N, K, dtiles.get(), dcount.get(),
                                    dy7.get(), nullptr, core);
  test::cuda_sync("bf16_routed_gemm_mma");
  const std::vector<float> y7 = dy7.download();
  EXPECT_EQ(dcount.download()[0], static_cast<int32_t>(tiles.size()));
  ASSERT_EQ(std::memcmp(y7.data(), y.data(), y.size() * sizeof(float)), 0) << "routed against listed";
  for (size_t i = y.size(); i < y7.size(); ++i) ASSERT_EQ(y7[i], sentinel) << "row " << i / N << " written";
}
#endif

TEST(CudaBf16GroupedGemm, GroupsMatchTheReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  // N and K off the tile and the step (200 outputs, a last step of 8 features); groups of one row,
  // of a tile and one more, of two tiles and two, and empty; rows before the first group.
  check_groups(200, 264, {1, 0, 64, 65, 130, 17, 3}, 5);
  // One output tile and one step exactly, one group.
  check_groups(128, 64, {64}, 0);
  // DeepSeek-V3's expert down projection at a tp-8-like width: K 2048 in 32 steps.
  check_groups(256, 2048, {70, 9}, 0);
#endif
}

// The same on Hopper's warpgroup products (bf16_grouped_gemm_wgmma.h): over the emulated runtime
// against its model of the descriptors and the 128-byte swizzle, on an H100 / H200 against the
// hardware's.
TEST(CudaBf16GroupedGemm, WgmmaGroupsMatchTheReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  if (!test::gpu_is_hopper()) GTEST_SKIP() << "wgmma needs an sm_90 GPU";
  check_groups(200, 264, {1, 0, 64, 65, 130, 17, 3}, 5, cuda::GemmCore::kWgmma);
  check_groups(128, 64, {64}, 0, cuda::GemmCore::kWgmma);
  check_groups(256, 2048, {70, 9}, 0, cuda::GemmCore::kWgmma);
#endif
}

TEST(CudaBf16GroupedGemm, TakesRowsOfWholeSixteenByteChunks) {
#ifdef SHARDLM_HAVE_CUDA
  EXPECT_TRUE(cuda::bf16_grouped_gemm_mma_fits(7168, 2048));
  EXPECT_TRUE(cuda::bf16_grouped_gemm_mma_fits(1, 8));
  EXPECT_FALSE(cuda::bf16_grouped_gemm_mma_fits(7168, 2044));  // rows not whole 16-byte chunks
  EXPECT_FALSE(cuda::bf16_grouped_gemm_mma_fits(0, 64));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
}  // namespace shardlm
