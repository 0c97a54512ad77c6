// CUDA routing, expert permutation and fp8 dequantisation against their CPU references:
// moe_topk against src/arch/moe_router (same ids in the same order, weights within 1e-6
// relative), expert_permute against kernels/cpu/expert_permute (bit-identical), fp8_dequant
// against dequant_fp8_block (bit-identical), fp8_act_quant against kernels/cpu/fp8_act_quant
// (bit-identical), the fixed-capacity exchange plans against kernels/cpu/expert_exchange (the same
// integers, blocks that overflow included). Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "arch/moe_router.h"
#include "common/gpu.h"
#include "core/dtype.h"
#include "cpu/expert_exchange.h"
#include "cpu/expert_permute.h"
#include "cpu/fp8_act_quant.h"
#include "cuda/device_buffer_moe.h"
#include "model/fp8_block.h"

#ifdef SHARDLM_HAVE_CUDA
#include "cuda/expert_exchange.h"
#include "cuda/expert_permute.h"
#include "cuda/fp8_act_quant.h"
#include "cuda/fp8_dequant.h"
#include "cuda/moe_topk.h"
#endif

namespace shardlm {
namespace {

#ifdef SHARDLM_HAVE_CUDA
using testmoe::DevArray;
using testmoe::expect_kernel_ok;

constexpr double kWeightTol = 1e-6;  // relative; the exponentials may differ by one ulp

std::vector<float> random_logits(int64_t n, float scale, uint32_t seed, float quantum = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = dist(gen);
    if (quantum > 0) x = std::round(x / quantum) * quantum;  // many exact ties
  }
  return v;
}

void expect_same_routing(const Routing& want, const std::vector<int32_t>& ids, const std::vector<float>& w) {
  ASSERT_EQ(ids.size(), want.experts.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(ids[i], want.experts[i]) << "token " << i / want.k << " slot " << i % want.k;
    ASSERT_NEAR(w[i], want.weights[i], kWeightTol * std::fabs(want.weights[i]) + 1e-30)
        << "token " << i / want.k << " slot " << i % want.k;
  }
}

void check_softmax(int64_t T, int E, int k, bool renorm, double scale, float quantum, uint32_t seed) {
  const std::vector<float> logits = random_logits(T * E, 2.0f, seed, quantum);
  Routing want;
  route_softmax_topk(logits.data(), T, E, k, renorm, scale, &want);
  DevArray<float> d_logits(logits), d_w(static_cast<size_t>(T * k));
  DevArray<int32_t> d_ids(static_cast<size_t>(T * k));
  cuda::launch_moe_topk_softmax(d_logits.get(), T, E, k, renorm, scale, d_ids.get(), d_w.get(), nullptr);
  expect_kernel_ok();
  expect_same_routing(want, d_ids.download(), d_w.download());
}

void check_sigmoid(int64_t T, int E, int k, bool with_bias, int n_group, int topk_group, bool norm, double scale,
                   float quantum, uint32_t seed) {
  const std::vector<float> logits = random_logits(T * E, 2.0f, seed, quantum);
  std::vector<float> bias = random_logits(E, 0.1f, seed + 1, quantum > 0 ? 0.125f : 0.0f);
  Routing want;
  route_sigmoid_grouped(logits.data(), T, E, k, with_bias ? bias.data() : nullptr, n_group, topk_group, norm, scale,
                        &want);
  DevArray<float> d_logits(logits), d_bias(bias), d_w(static_cast<size_t>(T * k));
  DevArray<int32_t> d_ids(static_cast<size_t>(T * k));
  cuda::launch_moe_topk_sigmoid(d_logits.get(), T, E, k, with_bias ? d_bias.get() : nullptr, n_group, topk_group,
                                norm, scale, d_ids.get(), d_w.get(), nullptr);
  expect_kernel_ok();
  expect_same_routing(want, d_ids.download(), d_w.download());
}
#endif

TEST(CudaMoeTopk, SoftmaxMatchesHostRouter) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_softmax(257, 8, 2, true, 1.0, 0, 1);     // Mixtral
  check_softmax(300, 64, 8, false, 1.0, 0, 2);   // Qwen2-MoE
  check_softmax(300, 128, 8, true, 1.0, 0, 3);   // Qwen3-MoE
  check_softmax(100, 60, 4, true, 2.5, 0, 4);
  check_softmax(100, 384, 8, true, 1.0, 0, 5);
  check_softmax(1, 1, 1, true, 1.0, 0, 6);
  check_softmax(9, 6000, 8, true, 1.0, 0, 9);  // 72 KB of shared arrays: past the default 48 KiB
#endif
}

TEST(CudaMoeTopk, SoftmaxTiesGoToTheLowerIndex) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_softmax(200, 64, 8, true, 1.0, 0.5f, 7);
  check_softmax(50, 16, 4, false, 1.0, 100.0f, 8);  // mostly all-equal rows
#endif
}

TEST(CudaMoeTopk, SigmoidGroupedMatchesHostRouter) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_sigmoid(300, 256, 8, true, 8, 4, true, 2.5, 0, 11);       // DeepSeek-V3
  check_sigmoid(300, 384, 8, true, 1, 1, true, 2.827, 0, 12);     // Kimi K2
  check_sigmoid(100, 256, 8, false, 8, 4, true, 2.5, 0, 13);      // no correction bias
  check_sigmoid(100, 64, 6, true, 8, 3, false, 1.0, 0, 14);       // no normalisation
  check_sigmoid(100, 16, 2, true, 16, 4, true, 1.0, 0, 15);       // one expert per group
  check_sigmoid(100, 64, 4, true, 4, 4, true, 1.0, 0, 16);        // every group kept
  check_sigmoid(9, 6000, 8, true, 8, 4, true, 2.5, 0, 17);        // past the default 48 KiB
#endif
}

TEST(CudaMoeTopk, SigmoidTiesGoToTheLowerIndex) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_sigmoid(200, 256, 8, true, 8, 4, true, 2.5, 0.5f, 17);  // ties among experts and groups
  check_sigmoid(200, 384, 8, false, 1, 1, true, 1.0, 1.0f, 18);
  check_sigmoid(20, 256, 8, false, 8, 4, true, 1.0, 1000.0f, 19);  // all equal
#endif
}

#ifdef SHARDLM_HAVE_CUDA
// masked: tokens t % 7 == 3 are padding rows (pos -1), and the per-expert counts are added up.
void check_permute(int64_t T, int k, int total, int e0, int E, int64_t H, uint32_t seed, bool masked = false) {
  std::mt19937 gen(seed);
  std::vector<int32_t> ids(static_cast<size_t>(T * k)), all(static_cast<size_t>(total));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    std::copy_n(all.begin(), k, ids.begin() + t * k);
  }
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * H)), w(ids.size());
  for (auto& v : x) v = dist(gen);
  for (auto& v : w) v = dist(gen);

  const size_t P = ids.size();
  std::vector<int32_t> pos(static_cast<size_t>(std::max<int64_t>(T, 1)));
  for (int64_t t = 0; t < T; ++t) pos[t] = t % 7 == 3 ? -1 : static_cast<int32_t>(t);
  std::vector<int32_t> offsets(static_cast<size_t>(E + 1)), slot_row(P), row_pair(P, -1);
  std::vector<int64_t> counts(static_cast<size_t>(E), 5);
  cpu::expert_permute(ids.data(), T, k, e0, E, masked ? pos.data() : nullptr, offsets.data(), slot_row.data(),
                      row_pair.data(), masked ? counts.data() : nullptr);
  const int64_t rows = offsets[E];
  std::vector<float> xp(static_cast<size_t>(rows * H));
  cpu::expert_gather(x.data(), H, k, row_pair.data(), offsets.data() + E, rows, xp.data());
  std::vector<float> yp(xp.size());
  for (auto& v : yp) v = dist(gen);
  std::vector<float> out(static_cast<size_t>(T * H));
  cpu::expert_combine(yp.data(), H, ids.data(), w.data(), slot_row.data(), T, k, out.data());

  DevArray<int32_t> d_ids(ids), d_offsets(static_cast<size_t>(E + 1)), d_slot(std::max<size_t>(P, 1)),
      d_pair(std::max<size_t>(P, 1));
  DevArray<float> d_x(x), d_w(w), d_xp(std::max<size_t>(P * H, 1)), d_yp(std::max<size_t>(P * H, 1)),
      d_out(static_cast<size_t>(T * H));
  std::vector<float> yp_full(d_yp.size(), 0.0f);
  std::copy(yp.begin(), yp.end(), yp_full.begin());
  d_yp.upload(yp_full);
  DevArray<int32_t> d_pos(pos);
  DevArray<int64_t> d_counts(std::vector<int64_t>(static_cast<size_t>(E), 5));
  cuda::launch_expert_permute(d_ids.get(), T, k, e0, E, masked ? d_pos.get() : nullptr, d_offsets.get(), d_slot.get(),
                              d_pair.get(), masked ? d_counts.get() : nullptr, nullptr);
  // The gather with a twin: the rows as before, and their bf16 rounding beside them.
  DevArray<uint16_t> d_twin(std::max<size_t>(P * H, 1));
  cuda::launch_expert_gather(d_x.get(), H, k, d_pair.get(), d_offsets.get() + E, T * k, d_xp.get(), d_twin.get(),
                             nullptr);
  cuda::launch_expert_combine(d_yp.get(), H, d_ids.get(), d_w.get(), d_slot.get(), T, k, d_out.get(), nullptr);
  expect_kernel_ok();

  EXPECT_EQ(d_offsets.download(), offsets);
  if (masked) {
    EXPECT_EQ(d_counts.download(), counts);
  }
  if (P == 0) return;
  EXPECT_EQ(d_slot.download(), slot_row);
  const std::vector<int32_t> got_pair = d_pair.download();
  ASSERT_TRUE(std::equal(row_pair.begin(), row_pair.begin() + rows, got_pair.begin()));
  const std::vector<float> got_xp = d_xp.download();
  ASSERT_EQ(std::memcmp(got_xp.data(), xp.data(), xp.size() * sizeof(float)), 0);
  const std::vector<uint16_t> got_twin = d_twin.download();
  for (size_t i = 0; i < xp.size(); ++i) ASSERT_EQ(got_twin[i], f32_to_bf16(xp[i])) << "twin of row " << i / H;
  const std::vector<float> got_out = d_out.download();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(got_out[i], out[i]) << "token " << i / H << " column " << i % H;
}
#endif

TEST(CudaExpertPermute, MatchesCpuReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_permute(37, 2, 8, 0, 8, 64, 1);          // every expert local
  check_permute(1000, 8, 256, 64, 32, 96, 2);    // a slice of DeepSeek-V3's 256 experts
  check_permute(513, 8, 384, 336, 48, 33, 3);    // Kimi K2's last slice, odd width
  check_permute(3000, 8, 384, 0, 384, 16, 4);    // many tiles, all 384 experts local
  check_permute(100, 8, 1024, 0, 1024, 8, 5);    // large E: shared memory beyond 48 KiB
  check_permute(50, 4, 64, 60, 4, 8, 6);         // few rows
  check_permute(0, 8, 64, 0, 16, 8, 7);          // no tokens: offsets all zero
  check_permute(256, 8, 256, 0, 256, 16, 8, true);  // a graph step's padding rows; counts added up
  check_permute(37, 2, 8, 2, 4, 24, 9, true);
#endif
}

#ifdef SHARDLM_HAVE_CUDA
// One rank's send plan of a share and an owner's recv plan of blocks from every rank, on the
// device and on the CPU. The owner's blocks are the send plans of ep shares of one routing (their
// meta rows; the records' rows stay as filled). Rows of H = 3 floats put the meta over several
// rows. invalid_ids: some ids outside [0, E) (-1, E), which no rank owns and every plan leaves out;
// pad_tail: trailing padding rows (a captured step's), which the shares leave out.
void check_exchange(int64_t T, int64_t k, int64_t E, int64_t ep, int64_t C, int64_t Cc, uint32_t seed,
                    bool invalid_ids = false, int64_t pad_tail = 0) {
  const int64_t H = 3;
  std::mt19937 gen(seed);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    // Skewed towards the low experts, so the first owner's blocks fill up.
    std::partial_sort(all.begin(), all.begin() + k, all.end(), [&](int32_t a, int32_t b) {
      return a + static_cast<int32_t>(gen() % E) < b + static_cast<int32_t>(gen() % E);
    });
    ids.insert(ids.end(), all.begin(), all.begin() + k);
  }
  if (invalid_ids)
    for (size_t i = 3; i < ids.size(); i += 7) ids[i] = i % 2 ? static_cast<int32_t>(E) : -1;
  std::vector<int32_t> pos(static_cast<size_t>(std::max<int64_t>(T, 1)));
  for (int64_t t = 0; t < T; ++t) pos[t] = t % 5 == 4 || t >= T - pad_tail ? -1 : static_cast<int32_t>(t);
  cpu::ExchangeShape s;
  s.ep = ep;
  s.L = E / ep;
  s.k = k;
  s.C = C;
  s.Cc = Cc;
  s.H = H;
  const int64_t R = s.block_rows();
  cuda::ExchangeGeometry g{static_cast<int>(ep), static_cast<int>(s.L), static_cast<int>(k), static_cast<int>(C),
                           static_cast<int>(Cc), static_cast<int>(H),   static_cast<int>(R)};
  DevArray<int32_t> d_ids(ids.empty() ? std::vector<int32_t>{0} : ids), d_pos(pos);
  // Block words compared as bit patterns (the meta is int32; the records' rows keep the fill).
  auto words = [](const std::vector<float>& f) {
    std::vector<uint32_t> w(f.size());
    std::memcpy(w.data(), f.data(), f.size() * sizeof(float));
    return w;
  };
  std::vector<float> owner_blocks(static_cast<size_t>(ep * R * H), 0.5f);
  const int64_t owner = 0;
  for (int64_t p = 0; p < ep; ++p) {
    const cpu::RowShare share{p, ep};  // the ep ranks as tp ranks sharing the rows
    std::vector<int32_t> rec(static_cast<size_t>(ep * R), 9),
        pair_row(static_cast<size_t>(std::max<int64_t>(T * k, 1)), 9);
    std::vector<float> blocks(static_cast<size_t>(ep * R * H), 0.5f);
    std::vector<int64_t> counts(static_cast<size_t>(E), 3);
    int32_t flag = 0;
    cpu::expert_send_plan(s, ids.data(), T, share, pos.data(), rec.data(), blocks.data(), pair_row.data(),
                          counts.data(), &flag);
    DevArray<int32_t> d_rec(std::vector<int32_t>(rec.size(), 9)), d_pair(std::vector<int32_t>(pair_row.size(), 9)),
        d_flag(std::vector<int32_t>{0});
    DevArray<float> d_blocks(std::vector<float>(blocks.size(), 0.5f));
    DevArray<int64_t> d_counts(std::vector<int64_t>(static_cast<size_t>(E), 3));
    cuda::launch_expert_send_plan(g, d_ids.get(), T, static_cast<int>(p), static_cast<int>(ep), d_pos.get(),
                                  d_rec.get(), d_blocks.get(), d_pair.get(), d_counts.get(), d_flag.get(), nullptr);
    expect_kernel_ok();
    EXPECT_EQ(d_rec.download(), rec) << "rank " << p;
    EXPECT_EQ(words(d_blocks.download()), words(blocks)) << "rank " << p;
    EXPECT_EQ(d_pair.download(), pair_row) << "rank " << p;
    EXPECT_EQ(d_counts.download(), counts) << "rank " << p;
    EXPECT_EQ(d_flag.download()[0], flag) << "rank " << p;
    std::copy_n(blocks.begin() + owner * R * H, R * H, owner_blocks.begin() + p * R * H);
  }
  std::vector<int32_t> offsets(static_cast<size_t>(s.L + 1)),
      row_src(static_cast<size_t>(std::max<int64_t>(ep * Cc, 1)), -9), back_row(row_src.size(), 9);
  cpu::expert_recv_plan(s, owner_blocks.data(), offsets.data(), row_src.data(), back_row.data());
  DevArray<float> d_blocks(owner_blocks);
  DevArray<int32_t> d_offsets(offsets.size()), d_src(std::vector<int32_t>(row_src.size(), -9)),
      d_back(std::vector<int32_t>(back_row.size(), 9));
  cuda::launch_expert_recv_plan(g, d_blocks.get(), d_offsets.get(), d_src.get(), d_back.get(), nullptr);
  expect_kernel_ok();
  EXPECT_EQ(d_offsets.download(), offsets);
  EXPECT_EQ(d_src.download(), row_src);
  EXPECT_EQ(d_back.download(), back_row);
}
#endif

TEST(CudaExpertExchange, PlansMatchCpuReference) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  check_exchange(16, 2, 8, 2, 8, 16, 1);    // worst-case blocks (tiny Mixtral over 2 ranks)
  check_exchange(64, 8, 256, 8, 8, 64, 2);  // DeepSeek-V3's experts over 8 ranks, blocks of 8 records
  check_exchange(64, 8, 256, 8, 3, 5, 3);   // blocks that overflow
  check_exchange(40, 6, 384, 64, 1, 2, 4);  // Kimi K2's experts over 64 ranks (more ranks than a warp)
  check_exchange(3, 4, 16, 4, 1, 4, 5);     // shares of no token
  check_exchange(0, 4, 16, 4, 0, 0, 6);     // no tokens: empty blocks
  check_exchange(1200, 8, 64, 2, 600, 2400, 7);     // shares and blocks of several 256-wide tiles
  check_exchange(1200, 8, 64, 4, 200, 300, 8);      // the same, overflowing
  check_exchange(300, 4, 16, 1, 300, 1200, 9);      // one rank
  check_exchange(90, 4, 16, 4, 90, 360, 10, true);  // ids no rank owns
  check_exchange(50, 4, 16, 4, 50, 200, 11, false, 13);  // shares of the real rows before the padding
  check_exchange(8, 4, 16, 2, 8, 32, 12, false, 8);      // no real rows: empty shares
#endif
}

#ifdef SHARDLM_HAVE_CUDA
void check_fp8(int64_t R, int64_t C, int64_t br, int64_t bc, const std::vector<uint8_t>& q,
               const std::vector<float>& scales) {
  TensorView w, s;
  w.name = "w";
  w.dtype = DType::F8_E4M3;
  w.shape = {R, C};
  w.data = q.data();
  w.nbytes = q.size();
  s.name = "w_scale_inv";
  s.dtype = DType::F32;
  s.shape = {(R + br - 1) / br, (C + bc - 1) / bc};
  s.data = scales.data();
  s.nbytes = scales.size() * 4;
  std::vector<uint16_t> want(static_cast<size_t>(R * C));
  dequant_fp8_block(w, s, br, bc, 0, R, 0, C, want.data());

  DevArray<uint8_t> d_q(q);
  DevArray<float> d_s(scales);
  DevArray<uint16_t> d_out(want.size());
  cuda::launch_fp8_dequant(d_q.get(), d_s.get(), R, C, br, bc, d_out.get(), nullptr);
  expect_kernel_ok();
  const std::vector<uint16_t> got = d_out.download();
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << "element " << i << " code 0x" << std::hex << int{q[i]};
}
#endif

TEST(CudaFp8Dequant, AllCodesBitIdentical) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  std::vector<uint8_t> q(256);
  std::iota(q.begin(), q.end(), 0);
  for (float scale : {1.0f, 0.5f, 3.0e-3f, 1.7e-38f, 7.3e4f, std::ldexp(1.0f, -140)})
    check_fp8(16, 16, 128, 128, q, {scale});
  // Every code through 2x2 blocks of different scales.
  check_fp8(16, 16, 8, 8, q, {1.0f, 0.25f, 1.5e-2f, 2.0e3f});
#endif
}

TEST(CudaFp8Dequant, RandomMatrixWithPartialEdgeBlocks) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> exp2(-20.0f, 4.0f);
  for (auto [R, C, br, bc] : {std::array<int64_t, 4>{300, 520, 128, 128}, {129, 257, 128, 128}, {7, 1000, 2, 64},
                              {1, 1, 128, 128}}) {
    std::vector<uint8_t> q(static_cast<size_t>(R * C));
    for (auto& v : q) v = static_cast<uint8_t>(byte(gen));
    std::vector<float> scales(static_cast<size_t>(((R + br - 1) / br) * ((C + bc - 1) / bc)));
    for (auto& v : scales) v = std::exp2(exp2(gen));
    check_fp8(R, C, br, bc, q, scales);
  }
#endif
}

// Activation quantisation for the W8A8 GEMMs: codes and scales bit for bit the CPU's, over rows
// whose magnitudes span 2^-30 to 2^20 (subnormal e4m3 codes included), zero blocks, a partial last
// block, a K not a multiple of 4, and a scale stride past the rows (left untouched).
TEST(CudaFp8ActQuant, MatchesCpuBitForBit) {
  SHARDLM_REQUIRE_GPU();
#ifdef SHARDLM_HAVE_CUDA
  std::mt19937 gen(17);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto [M, K, ld] : {std::array<int64_t, 3>{1, 128, 1}, {7, 300, 12}, {33, 1024, 33}, {4, 129, 4}, {3, 70, 5}}) {
    SCOPED_TRACE(::testing::Message() << "M " << M << " K " << K << " ld " << ld);
    const int64_t L = (K + 127) / 128;
    std::vector<float> x(static_cast<size_t>(M * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        x[m * K + k] = d(gen) * std::ldexp(1.0f, static_cast<int>((m * 13 + k / 128 * 5) % 51) - 30);
    if (M > 2) std::fill_n(&x[2 * K], std::min<int64_t>(K, 128), 0.0f);
    std::vector<uint8_t> want_q(x.size());
    std::vector<float> want_s(static_cast<size_t>(L * ld), -1.0f);
    cpu::fp8_act_quant(x.data(), M, K, want_q.data(), want_s.data(), ld);
    DevArray<float> dx(x);
    DevArray<uint8_t> dq(x.size());
    DevArray<float> ds(std::vector<float>(want_s.size(), -1.0f));
    cuda::launch_fp8_act_quant(dx.get(), M, K, dq.get(), ds.get(), ld, nullptr);
    expect_kernel_ok();
    EXPECT_EQ(dq.download(), want_q);
    const std::vector<float> got_s = ds.download();
    ASSERT_EQ(got_s.size(), want_s.size());
    EXPECT_EQ(std::memcmp(got_s.data(), want_s.data(), want_s.size() * sizeof(float)), 0);
  }
#endif
}

}  // namespace
}  // namespace shardlm
