// W8A8 linears: y[M, N] = x[M, K] W^T for a weight kept fp8 with 128x128 block scales (DeepSeek-V3,
// Kimi K2), as a block-scaled fp8 GEMM on Hopper's fp8 tensor cores (cuBLASLt, cuBLAS 12.9+).
//
//  - The activations are quantised per row and 128 features to e4m3 with an fp32 scale
//    (kernels/cuda/fp8_act_quant.h), as DeepSeek-V3's reference inference does before its fp8 GEMMs.
//  - cuBLASLt computes, per 128-feature block, the code products' sum and scales it by the weight
//    block's scale times the row block's scale (fp32 accumulation), in the "TN" form Hopper needs:
//    A = the weight (K x N column-major is W [N, K] row-major, transposed) with
//    CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F scales ([ceil(N/128)][L4], K-major, L4 = the block
//    count rounded up to 4: load_fp8_matrix pads the rows so), B = the codes [M, K] with
//    CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F scales ([L][M], token-major), D = y (fp32, N x M
//    column-major = [M, N] row-major).
//  - cuBLASLt asks M (here N) and N (here the rows) to be multiples of 4 and the matrices 16-byte
//    aligned: the first M - M % 4 rows go through it and the last (at most 3) through the direct
//    fp8 kernel; a weight off the 128x128 grid (a slice not starting on it), a K or N off the
//    16-byte grid or a shape cuBLASLt declines returns false and the caller dequantises instead
//    (once per shape a line on stderr says which and why).
// A step run before its CUDA graph capture makes the plan and grows the workspaces, so the capture
// only records the quantisation and the cublasLtMatmul. Before its first GEMM the backend checks
// cuBLASLt's result on a problem that both it and the direct kernel compute exactly
// (w8a8_self_check): a cuBLAS that read the scales otherwise would turn W8A8 off, said on stderr,
// rather than give wrong prefills. The routed experts' groups run in one grouped launch of the
// backend's own W8A8 kernel instead where they can (cuda_fp8_grouped_gemm.cpp).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "compute/cuda_backend.h"
#include "compute/check_buffers.h"
#include "compute/cuda_check.h"
#include "core/error.h"
#include "cuda/fp8_act_quant.h"
#include "fp8_bits.h"

namespace shardlm {

namespace {

constexpr int64_t kBlock = 128;
// The most workspace an algorithm may ask for (cuBLAS's recommendation for Hopper); the buffer
// grows to what the chosen ones ask.
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
constexpr int kDeclinesShown = 4;

cublasLtHandle_t lt_of(void* p) { return static_cast<cublasLtHandle_t>(p); }
cublasLtMatmulDesc_t desc_of(void* p) { return static_cast<cublasLtMatmulDesc_t>(p); }
cublasLtMatrixLayout_t layout_of(void* p) { return static_cast<cublasLtMatrixLayout_t>(p); }

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment preference).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

}  // namespace

const CudaBackend::W8a8Plan& CudaBackend::w8a8_plan(int64_t N, int64_t M, int64_t K, uint32_t align_w,
                                                    uint32_t align_y) {
  const auto key = std::make_tuple(N, M, K, align_w, align_y);
  if (auto it = w8a8_plans_.find(key); it != w8a8_plans_.end()) return it->second;
  W8a8Plan& p = w8a8_plans_[key];
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, K, N, K));
  p.a = a;
  SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, K, M, K));
  p.b = b;
  SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, N, M, N));
  p.d = d;
  cublasLtMatmulPreference_t pref = nullptr;
  SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspaceBytes;
  const uint32_t align_q = 256;  // the codes start a cudaMalloc'ed workspace
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto [attr, v] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
                         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_q},
                         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y},
                         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y}})
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt_of(lt_), desc_of(lt_desc_), a, b, d, d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.workspaceSize <= kLtWorkspaceBytes) {
    // The workspace first: a plan marked usable whose growth threw would run on a smaller one.
    grown_workspace(lt_ws_, lt_ws_n_, result.workspaceSize, "cuBLASLt");
    static_assert(sizeof(result.algo) == sizeof(p.algo), "cublasLtMatmulAlgo_t is 64 bytes");
    std::memcpy(p.algo, &result.algo, sizeof(p.algo));
    p.workspace = result.workspaceSize;
    p.ok = true;
  } else if (++w8a8_declined_ <= kDeclinesShown) {
    // Prefill row counts vary step by step: the first few declined shapes say it, not every one.
    std::fprintf(stderr,
                 "shardlm: cuBLASLt has no block-scaled fp8 GEMM for %lld x %lld x %lld (rows x out x in; "
                 "alignments %u, %u: %s): these linears dequantise the weight to bf16%s\n",
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), align_w, align_y,
                 st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusName(st) : "no algorithm",
                 w8a8_declined_ == kDeclinesShown ? " (further such shapes are not listed)" : "");
  }
  return p;
}

bool CudaBackend::linear_w8a8(const float* x, int64_t M, const Matrix& w, float* y) {
  const int64_t Mq = M - M % 4;
  if (Mq == 0 || !w8a8_ready() || !w8a8_gemm(x, Mq, w, y)) return false;
  if (M > Mq) linear_fp8_direct(x + Mq * w.cols, M - Mq, w, y + Mq * w.rows);
  ++fp8_w8a8_calls_;
  return true;
}

bool CudaBackend::w8a8_ready() {
  if (!w8a8_ || w8a8_bad_) return false;
  if (w8a8_checked_) return true;
  SHARDLM_CHECK(!capturing_,
                "cuda backend: the first W8A8 linear while capturing a CUDA graph (run the step "
                "once before capturing it)");
  w8a8_checked_ = true;
  return w8a8_self_check();
}

bool CudaBackend::w8a8_gemm(const float* x, int64_t M, const Matrix& w, float* y) {
  const int64_t N = w.rows, K = w.cols, L = (K + kBlock - 1) / kBlock, L4 = (L + 3) / 4 * 4;
  const Fp8Blocks& f = w.fp8;
  if (M % 4 != 0 || f.block_rows != kBlock || f.block_cols != kBlock || f.row_off != 0 || f.col_off != 0 ||
      f.cols != L4 || N % 4 != 0 || K % 16 != 0 || alignment_of(w.data) < 16 || alignment_of(f.scale_inv) < 16 ||
      alignment_of(y) < 16)
    return false;
  if (lt_ == nullptr) {
    cublasLtHandle_t h = nullptr;
    SHARDLM_CUBLAS_CHECK(cublasLtCreate(&h));
    lt_ = h;
    cublasLtMatmulDesc_t d = nullptr;
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    lt_desc_ = d;
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                  b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  }
  // The codes, then the scales at the next 256-byte boundary (cuBLASLt wants 16).
  const size_t codes = (static_cast<size_t>(M * K) + 255) / 256 * 256;
  uint8_t* ws = grown_workspace(w8a8_ws_, w8a8_ws_n_, codes + static_cast<size_t>(L * M) * sizeof(float), "W8A8");
  auto* q = ws;
  auto* scales = reinterpret_cast<float*>(ws + codes);
  // The scale pointers go into the descriptor before the heuristic (cuBLASLt asks block-scaled modes
  // for them) and again for every call, which reads them as it is issued (or captured).
  const float* a_scale = f.scale_inv;
  SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_of(lt_desc_), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                      sizeof(a_scale)));
  const float* b_scale = scales;
  SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_of(lt_desc_), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                      sizeof(b_scale)));
  const W8a8Plan& p = w8a8_plan(N, M, K, alignment_of(w.data), alignment_of(y));
  if (!p.ok) return false;

  const cudaStream_t s = stream_of(stream_);
  cuda::launch_fp8_act_quant(x, M, K, q, scales, M, s);
  check_launch("fp8_act_quant");
  const float alpha = 1.0f, beta = 0.0f;
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, p.algo, sizeof(algo));
  SHARDLM_CUBLAS_CHECK(cublasLtMatmul(lt_of(lt_), desc_of(lt_desc_), &alpha, w.data, layout_of(p.a), q, layout_of(p.b),
                                      &beta, y, layout_of(p.d), y, layout_of(p.d), &algo,
                                      p.workspace ? lt_ws_ : nullptr, p.workspace, s));
  return true;
}

// A problem whose every value is exact in e4m3 with power-of-two scales that differ per block (a
// weight of 2 x 3 blocks, its scale rows padded to 4; 16 rows whose blocks each reach 448 times a
// power of two, so their quantisation is exact): the W8A8 GEMM and the direct fp8 kernel then
// form the same exact products and differ in summation order only, while a scale read from the
// wrong place would be off by a factor of 2 or more. The grouped W8A8 kernel
// (cuda_fp8_grouped_gemm.cpp) is checked on the same problem: a tensor core fragment read other
// than its PTX layout, or a scale from the wrong block, turns it off alone.
bool CudaBackend::w8a8_self_check() {
  constexpr int64_t N = 256, K = 384, M = 16, L = 3, L4 = 4;
  std::mt19937 g(11);
  std::vector<uint8_t> codes(static_cast<size_t>(N * K));
  for (uint8_t& c : codes) c = static_cast<uint8_t>((g() % 0x6f) | (g() & 0x80));  // finite, |c| <= 112
  std::vector<float> w_scales(static_cast<size_t>((N / kBlock) * L4), 0.0f);
  for (int64_t r = 0; r < N / kBlock; ++r)
    for (int64_t b = 0; b < L; ++b)
      w_scales[static_cast<size_t>(r * L4 + b)] = std::ldexp(1.0f, static_cast<int>(r * 3 + b) - 4);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const int e = static_cast<int>((m + 2 * (k / kBlock)) % 7) - 3;
      const uint8_t c = k % kBlock == 5 ? 0x7e : static_cast<uint8_t>((g() % 0x7e) | (g() & 0x80));
      x[static_cast<size_t>(m * K + k)] = std::ldexp(fp8_bits::to_f32(c), e);
    }
  CheckBuffers buf{*this, {}};
  const float* dx = buf.up(x);
  std::vector<float> got(static_cast<size_t>(3 * M * N));
  float* y = buf.up(got);
  Matrix w;
  w.dtype = DType::F8_E4M3;
  w.rows = N;
  w.cols = K;
  w.data = buf.up(codes);
  w.fp8.scale_inv = buf.up(w_scales);
  w.fp8.cols = L4;
  w.fp8.block_rows = w.fp8.block_cols = kBlock;
  const bool ran = w8a8_gemm(dx, M, w, y);
  linear_fp8_direct(dx, M, w, y + M * N);
  // The grouped kernel on the same rows as two groups of one weight (5 and 11 rows), whether or not
  // it is wanted now (set_fp8_grouped_gemm may ask for it later).
  const auto* wc = static_cast<const uint8_t*>(w.data);
  run_grouped_gemm_fp8(dx, M, fp8_weight(w), {{wc, w.fp8.scale_inv, 0, 5, 0}, {wc, w.fp8.scale_inv, 5, 11, 0}},
                       y + 2 * M * N);
  copy_to_host(got.data(), y, got.size() * sizeof(float));
  double worst = 0, worst_grouped = 0, scale = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - got[M * N + i]));
    worst_grouped = std::max(worst_grouped, std::fabs(static_cast<double>(got[2 * M * N + i]) - got[M * N + i]));
    scale = std::max(scale, std::fabs(static_cast<double>(got[M * N + i])));
  }
  // Hopper's fp8 tensor cores keep about 14 bits within a block before the fp32 scaling.
  const double bound = 2e-3 * scale;
  grouped_gemm_bad_ = !(worst_grouped <= bound);
  if (grouped_gemm_bad_ && grouped_gemm_) {
    std::fprintf(stderr,
                 "shardlm: the grouped W8A8 kernel disagrees with the direct fp8 kernel on a problem both compute "
                 "exactly (largest difference %.3g of %.3g): the experts' fp8 GEMMs run one per expert\n",
                 worst_grouped, scale);
  }
  if (ran && worst <= bound) return true;
  w8a8_bad_ = true;
  if (ran)
    std::fprintf(stderr,
                 "shardlm: cuBLASLt's block-scaled fp8 GEMM disagrees with the direct fp8 kernel on a problem both "
                 "compute exactly (largest difference %.3g of %.3g): W8A8 is off, prefill linears on fp8 weights "
                 "dequantise to bf16\n",
                 worst, scale);
  else
    std::fprintf(stderr,
                 "shardlm: cuBLASLt runs no block-scaled fp8 GEMM here (not even the check's %lld x %lld x %lld): "
                 "W8A8 is off, prefill linears on fp8 weights dequantise to bf16\n",
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K));
  return false;
}

void CudaBackend::release_w8a8() {
  for (auto& [key, p] : w8a8_plans_)
    for (void* l : {p.a, p.b, p.d})
      if (l) cublasLtMatrixLayoutDestroy(layout_of(l));
  w8a8_plans_.clear();
  if (lt_desc_) cublasLtMatmulDescDestroy(desc_of(lt_desc_));
  if (lt_) cublasLtDestroy(lt_of(lt_));
  cudaFree(lt_ws_);
  cudaFree(w8a8_ws_);
  lt_desc_ = lt_ = nullptr;
  lt_ws_ = nullptr;
  w8a8_ws_ = nullptr;
}

}  // namespace shardlm
