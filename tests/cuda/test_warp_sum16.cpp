// kernels/cuda/warp_sum16.h run on the host over 32 emulated lanes (one thread each, shuffles
// through a barrier): lanes 2j and 2j + 1 must get sum j with exactly the bits of the xor butterfly
// the attention kernels used before (block_reduce.cuh warp_sum). Runs without CUDA; the
// kernels built on it are checked against the CPU on a GPU (test_cuda_attention.cpp).
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <thread>
#include <vector>

#include "cuda/warp_sum16.h"

namespace {

constexpr int kLanes = 32;

// warp_sum's butterfly on the host: after step o every lane holds v[l] + v[l ^ o].
float butterfly(std::vector<float> v, int lane) {
  for (int o = 16; o > 0; o >>= 1) {
    std::vector<float> next(kLanes);
    for (int l = 0; l < kLanes; ++l) next[l] = v[l] + v[l ^ o];
    v = next;
  }
  return v[lane];
}

// Values over a wide range of magnitudes and both signs, so that a different order of additions
// would show in the low bits.
std::vector<std::vector<float>> make_sets(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(0.5f, 1.0f);
  std::uniform_int_distribution<int> E(-24, 24), S(0, 1);
  std::vector<std::vector<float>> sets(n, std::vector<float>(kLanes * 16));
  for (auto& s : sets)
    for (float& x : s) x = std::ldexp(U(rng), E(rng)) * (S(rng) ? 1.0f : -1.0f);
  return sets;
}

}  // namespace

TEST(WarpSum16, LanePairsGetTheButterflysBits) {
  const auto sets = make_sets(40, 7);  // sets[s][lane * 16 + j]: lane's value of sum j
  std::vector<float> got(sets.size() * kLanes);  // got[s * kLanes + lane]
  float slot[kLanes][8];
  std::barrier sync(kLanes);
  auto exchange = [&](int lane, const auto& send, auto& recv, int src) {
    const size_t n = std::size(send);
    for (size_t i = 0; i < n; ++i) slot[lane][i] = send[i];
    sync.arrive_and_wait();
    for (size_t i = 0; i < n; ++i) recv[i] = slot[src][i];
    sync.arrive_and_wait();  // nobody overwrites slot before every lane has read
  };
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < kLanes; ++lane) {
    lanes.emplace_back([&, lane] {
      for (size_t s = 0; s < sets.size(); ++s) {
        float p[16];
        for (int j = 0; j < 16; ++j) p[j] = sets[s][lane * 16 + j];
        got[s * kLanes + lane] = shardlm::cuda::detail::warp_sum16_pairs(
            p, lane, [&](const auto& send, auto& recv, int o) { exchange(lane, send, recv, lane ^ o); });
      }
    });
  }
  for (auto& t : lanes) t.join();

  int order_matters = 0;  // sums whose sequential total differs from the butterfly's
  for (size_t s = 0; s < sets.size(); ++s) {
    for (int j = 0; j < 16; ++j) {
      std::vector<float> v(kLanes);
      float sequential = 0.0f;
      for (int l = 0; l < kLanes; ++l) sequential += v[l] = sets[s][l * 16 + j];
      for (int lane = 2 * j; lane < 2 * j + 2; ++lane) {
        const float want = butterfly(v, lane), have = got[s * kLanes + lane];
        ASSERT_EQ(0, std::memcmp(&want, &have, sizeof(float)))
            << "set " << s << ", sum " << j << ", lane " << lane << ": " << have << " vs " << want;
      }
      order_matters += sequential != butterfly(v, 0);
    }
  }
  // The data can tell orders apart: the check above would catch a reduction in another order.
  EXPECT_GT(order_matters, 100);
}
