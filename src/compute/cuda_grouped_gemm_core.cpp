// Which tensor-core products the grouped expert GEMMs run on. On an sm_90 device (H100, H200) the
// wgmma kernels (kernels/cuda/*_grouped_gemm_wgmma.h) read both operands from shared memory through
// descriptors and reach the fp8 rate mma.sync cannot (mma_fp8.cuh); elsewhere, and when asked
// (--grouped-gemm-core mma-sync), the mma.sync kernels run.
//
// Before the first wgmma GEMM a self-check runs both cores' bf16 and fp8 kernels on problems each
// computes exactly (small integers, power-of-two scales: every partial sum is exact, so the two
// must agree to the bit): a descriptor, swizzle or fragment the hardware reads otherwise than the
// kernels assume, or a build whose device code lacks the products (not sm_90a: its blocks compute
// nothing), makes wgmma off for good, said on stderr, and the mma.sync kernels run.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "compute/check_buffers.h"
#include "compute/cuda_backend.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/bf16_grouped_gemm_mma.h"
#include "cuda/fp8_grouped_gemm_mma.h"

namespace shardlm {

std::string CudaBackend::grouped_gemm_core() const {
  return wgmma_ && !wgmma_bad_ && has_wgmma_ ? "wgmma" : "mma.sync";
}

cuda::GemmCore CudaBackend::grouped_core() {
  if (!wgmma_ || wgmma_bad_ || !has_wgmma_) return cuda::GemmCore::kMmaSync;
  if (!wgmma_checked_) {
    // A capture never runs the check (the step's eager run before it has); until then, mma.sync.
    if (capturing_) return cuda::GemmCore::kMmaSync;
    wgmma_checked_ = true;
    wgmma_bad_ = !wgmma_self_check();
  }
  return wgmma_bad_ ? cuda::GemmCore::kMmaSync : cuda::GemmCore::kWgmma;
}

cuda::GemmCore CudaBackend::launch_core() {
  last_core_ = grouped_core();
  if (last_core_ == cuda::GemmCore::kWgmma) ++wgmma_gemm_calls_;
  return last_core_;
}

bool CudaBackend::wgmma_self_check() {
  // Two groups (37 and 43 rows: a full tile and partial ones) against 192 outputs (a second,
  // partial output tile) over 3 steps of both kernels (K 192 bf16, 384 e4m3).
  constexpr int64_t R = 80, N = 192, Kb = 192, Kq = 384, L = Kq / 128;
  const std::vector<int64_t> sizes = {37, 43};
  std::mt19937 g(29);
  // bf16 and e4m3 codes of -2 .. 2.
  const uint16_t bf16_of[5] = {0xc000, 0xbf80, 0x0000, 0x3f80, 0x4000};
  const uint8_t e4m3_of[5] = {0xc0, 0xb8, 0x00, 0x38, 0x40};
  auto bf16s = [&](int64_t n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = bf16_of[g() % 5];
    return v;
  };
  auto codes = [&](int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = e4m3_of[g() % 5];
    return v;
  };
  auto pow2s = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<float>(1 << (g() % 4)) / 4.0f;
    return v;
  };
  CheckBuffers buf{*this, {}};
  const cudaStream_t s = stream_of(stream_);

  // bf16: x [R, Kb], one weight [N, Kb] a group.
  const uint16_t* xb = buf.up(bf16s(R * Kb));
  std::vector<cuda::GemmTile> tiles;
  int64_t row0 = 0;
  for (int64_t n : sizes) {
    tiles.push_back({buf.up(bf16s(N * Kb)), nullptr, row0, static_cast<int32_t>(n), 0});
    row0 += n;
  }
  const cuda::GemmTile* dtiles = buf.up(tiles);
  // fp8: codes [R, Kq] with scales [L][R]; weights [N, Kq] with scales [2][L].
  const uint8_t* q = buf.up(codes(R * Kq));
  const float* qs = buf.up(pow2s(L * R));
  std::vector<cuda::GemmTile> qtiles = tiles;
  for (auto& t : qtiles) {
    t.weight = buf.up(codes(N * Kq));
    t.scale_inv = buf.up(pow2s(2 * L));
  }
  const cuda::GemmTile* dqtiles = buf.up(qtiles);
  cuda::Fp8Weight shape;
  shape.N = N;
  shape.K = Kq;
  shape.scale_cols = L;
  shape.block_rows = shape.block_cols = 128;

  // y: [core][bf16, fp8][R, N].
  float* y = buf.up(std::vector<float>(static_cast<size_t>(4 * R * N), -1.0f));
  for (int c = 0; c < 2; ++c) {
    const auto core = c == 0 ? cuda::GemmCore::kMmaSync : cuda::GemmCore::kWgmma;
    float* yc = y + c * 2 * R * N;
    cuda::launch_bf16_grouped_gemm_mma(xb, dtiles, static_cast<int64_t>(tiles.size()), N, Kb, yc, s, core);
    check_launch("bf16_grouped_gemm (self-check)");
    cuda::launch_fp8_grouped_gemm_mma(q, qs, R, dqtiles, static_cast<int64_t>(qtiles.size()), shape, yc + R * N, s,
                                      core);
    check_launch("fp8_grouped_gemm (self-check)");
  }
  std::vector<float> got(static_cast<size_t>(4 * R * N));
  copy_to_host(got.data(), y, got.size() * sizeof(float));
  int64_t differ[2] = {0, 0};
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t i = 0; i < R * N; ++i)
      differ[k] += std::memcmp(&got[k * R * N + i], &got[(2 + k) * R * N + i], sizeof(float)) != 0;
  if (differ[0] == 0 && differ[1] == 0) return true;
  std::fprintf(stderr,
               "shardlm: the grouped GEMMs on wgmma disagree with their mma.sync kernels on problems both compute "
               "exactly (%lld of %lld bf16 outputs, %lld of %lld fp8 outputs differ): the grouped GEMMs run on "
               "mma.sync\n",
               static_cast<long long>(differ[0]), static_cast<long long>(R * N), static_cast<long long>(differ[1]),
               static_cast<long long>(R * N));
  return false;
}

}  // namespace shardlm
