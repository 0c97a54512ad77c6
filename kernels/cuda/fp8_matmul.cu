// A warp computes kRowsPerWarp outputs n for up to MT activation rows: each lane walks K in 16-code
// steps (or one code per step on the general path), dequantising each code once for all MT rows.
//
// Dequantisation without conversions (the type conversions run at a quarter of the integer rate):
// code c = S.EEEE.MMM placed at f32 bits S | EEEE.MMM << 20 is fp32(c) * 2^-120 exactly, the
// subnormal codes (EEEE = 0) included, which land on fp32 subnormals; one fp32 multiply by
// scale * 2^120 then gives fp32(c) * scale rounded once, as the host rounds it. The integer bf16
// rounding follows. A step whose codes hold a NaN (S.1111.111) or whose scale is not below 2^8 (so
// scale * 2^120 is not finite) takes the plain conversion instead, with the same values. fp32
// subnormals must not be flushed: the kernels build without fast math.
#include "cuda/fp8_matmul.h"

#include <cstdint>
#include <cstring>

#include "fp8_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 2;
constexpr int kThreads = kWarps * 32;
constexpr int kVec = 16;  // codes per lane and step on the 16-byte path
constexpr int kMaxRows = static_cast<int>(kFp8MatmulRowsPerPass);
constexpr float kTwo120 = 1.329227995784916e36f;  // 2^120
constexpr float kScaleLimit = 256.0f;             // scale * 2^120 is finite below 2^8

struct alignas(16) Words4 {
  uint32_t w[4];
};

__device__ inline Words4 load16(const void* p) {
#if defined(__CUDA_ARCH__)
  const uint4 v = *static_cast<const uint4*>(p);
  return Words4{{v.x, v.y, v.z, v.w}};
#else
  Words4 r;
  std::memcpy(&r, p, sizeof r);
  return r;
#endif
}

// bf16 round to nearest even, returned widened; only for values that are not NaN.
__device__ inline float round_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xffff0000u);
}

// The exact value of one weight, any code and any scale (NaN kept NaN, as the host keeps it).
__device__ inline float weight_exact(uint8_t code, float scale) {
  const float p = fp8_bits::to_f32(code) * scale;
  if (isnan(p)) return p;
  return round_bf16(p);
}

// Code j (0..3) of a word as fp32(code) * 2^-120.
template <int J>
__device__ inline float code_scaled_down(uint32_t word) {
  constexpr int kShift = 8 * J;
  const uint32_t c = word >> kShift;
  return __uint_as_float(((c & 0x7fu) << 20) | ((c & 0x80u) << 24));
}

// Whether any of the 4 codes of a word is a NaN (magnitude 0x7f): adding 1 to each 7-bit magnitude
// carries into bit 7 only for 0x7f, and never across bytes.
__device__ inline bool has_nan_code(uint32_t word) { return (((word & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0; }

__device__ inline float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ inline float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }

__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Grid: x covers N in kWarps * kRowsPerWarp outputs per block, y the passes: kMaxRows rows each of
// one weight, or (kGrouped) passes[blockIdx.y], each naming its weight and rows.
template <int MT, bool kVectorised, bool kGrouped>
__global__ void __launch_bounds__(kThreads)
    fp8_matmul_kernel(const uint16_t* __restrict__ x, int64_t M, const uint8_t* __restrict__ codes,
                      const float* __restrict__ scale_inv, int64_t N, int64_t K, int64_t scale_cols,
                      int64_t block_rows, int64_t block_cols, int block_cols_log2, int64_t row_off, int64_t col_off,
                      float* __restrict__ y, const Fp8MatmulPass* __restrict__ passes) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  int64_t m0;
  int rows;
  if (kGrouped) {
    const Fp8MatmulPass p = passes[blockIdx.y];
    codes = p.codes;
    scale_inv = p.scale_inv;
    m0 = p.row0;
    rows = p.rows < MT ? p.rows : MT;
  } else {
    m0 = static_cast<int64_t>(blockIdx.y) * kMaxRows;
    rows = static_cast<int>(M - m0 < MT ? M - m0 : MT);
  }

  float acc[kRowsPerWarp][MT];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;

  // Scale rows of this warp's outputs; an output past N repeats the last one (its sums are dropped).
  int64_t srow[kRowsPerWarp];
  int64_t nrow[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    nrow[r] = n0 + r < N ? n0 + r : N - 1;
    srow[r] = ((nrow[r] + row_off) / block_rows) * scale_cols;
  }

  if (kVectorised) {
    for (int64_t k = static_cast<int64_t>(lane) * kVec; k < K; k += 32 * kVec) {
      // Both rows' weights first, then one activation row at a time: 2 x 16 weights and 16
      // activations live at once, whatever MT (registers, so occupancy, do not grow with it).
      const int64_t sblock = (k + col_off) >> block_cols_log2;
      float wv[kRowsPerWarp][kVec];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const Words4 c = load16(codes + nrow[r] * K + k);
        const float s = scale_inv[srow[r] + sblock];
        const bool plain = !(s < kScaleLimit && s > -kScaleLimit) || has_nan_code(c.w[0]) || has_nan_code(c.w[1]) ||
                           has_nan_code(c.w[2]) || has_nan_code(c.w[3]);
        if (!plain) {
          const float s_up = s * kTwo120;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            wv[r][4 * j] = round_bf16(code_scaled_down<0>(c.w[j]) * s_up);
            wv[r][4 * j + 1] = round_bf16(code_scaled_down<1>(c.w[j]) * s_up);
            wv[r][4 * j + 2] = round_bf16(code_scaled_down<2>(c.w[j]) * s_up);
            wv[r][4 * j + 3] = round_bf16(code_scaled_down<3>(c.w[j]) * s_up);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            wv[r][j] = weight_exact(static_cast<uint8_t>(c.w[j / 4] >> (8 * (j % 4))), s);
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= rows) continue;  // a row past the pass: its sums are never written
        const uint16_t* xr = x + (m0 + m) * K + k;
        const Words4 a = load16(xr), b = load16(xr + 8);
        float xv[kVec];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          xv[2 * j] = bf16_lo(a.w[j]);
          xv[2 * j + 1] = bf16_hi(a.w[j]);
          xv[8 + 2 * j] = bf16_lo(b.w[j]);
          xv[8 + 2 * j + 1] = bf16_hi(b.w[j]);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
          for (int j = 0; j < kVec; ++j) acc[r][m] = fmaf(wv[r][j], xv[j], acc[r][m]);
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
      float xv[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m)
        xv[m] = m < rows ? __uint_as_float(static_cast<uint32_t>(x[(m0 + m) * K + k]) << 16) : 0.0f;
      const int64_t sblock = (k + col_off) / block_cols;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float wv = weight_exact(codes[nrow[r] * K + k], scale_inv[srow[r] + sblock]);
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(wv, xv[m], acc[r][m]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const float v = warp_sum(acc[r][m]);
      if (lane == r * MT + m && n0 + r < N && m < rows) y[(m0 + m) * N + n0 + r] = v;
    }
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return (int64_t{1} << l) == v ? l : -1;
}

template <int MT, bool kVectorised, bool kGrouped = false>
void launch_pass(const uint16_t* x, int64_t M, const Fp8Weight& w, int bc_log2, unsigned passes, float* y,
                 cudaStream_t stream, const Fp8MatmulPass* pass_list = nullptr) {
  const int64_t per_block = kWarps * kRowsPerWarp;
  const dim3 grid(static_cast<unsigned>((w.N + per_block - 1) / per_block), passes);
  fp8_matmul_kernel<MT, kVectorised, kGrouped><<<grid, kThreads, 0, stream>>>(
      x, M, w.codes, w.scale_inv, w.N, w.K, w.scale_cols, w.block_rows, w.block_cols, bc_log2, w.row_off, w.col_off, y,
      pass_list);
}

template <bool kVectorised>
void launch_grouped(const uint16_t* x, const Fp8MatmulPass* passes, int64_t n_passes, int max_rows,
                    const Fp8Weight& w, int bc_log2, float* y, cudaStream_t stream) {
  const auto n = static_cast<unsigned>(n_passes);
  if (max_rows <= 1)
    launch_pass<1, kVectorised, true>(x, 0, w, bc_log2, n, y, stream, passes);
  else if (max_rows <= 2)
    launch_pass<2, kVectorised, true>(x, 0, w, bc_log2, n, y, stream, passes);
  else if (max_rows <= 4)
    launch_pass<4, kVectorised, true>(x, 0, w, bc_log2, n, y, stream, passes);
  else
    launch_pass<8, kVectorised, true>(x, 0, w, bc_log2, n, y, stream, passes);
}

template <bool kVectorised>
void launch_all(const uint16_t* x, int64_t M, const Fp8Weight& w, int bc_log2, float* y, cudaStream_t stream) {
  // Whole passes of kMaxRows rows, then one pass of the remainder with the fewest accumulators.
  const int64_t full = M / kMaxRows, rest = M % kMaxRows;
  if (full > 0)
    launch_pass<kMaxRows, kVectorised>(x, full * kMaxRows, w, bc_log2, static_cast<unsigned>(full), y, stream);
  if (rest == 0) return;
  const uint16_t* xr = x + full * kMaxRows * w.K;
  float* yr = y + full * kMaxRows * w.N;
  if (rest == 1)
    launch_pass<1, kVectorised>(xr, rest, w, bc_log2, 1, yr, stream);
  else if (rest == 2)
    launch_pass<2, kVectorised>(xr, rest, w, bc_log2, 1, yr, stream);
  else if (rest <= 4)
    launch_pass<4, kVectorised>(xr, rest, w, bc_log2, 1, yr, stream);
  else
    launch_pass<8, kVectorised>(xr, rest, w, bc_log2, 1, yr, stream);
}

}  // namespace

bool fp8_matmul_vectorised(const Fp8Weight& w, const uint16_t* x_bf16) {
  return w.K % kVec == 0 && w.block_cols % kVec == 0 && log2_exact(w.block_cols) >= 0 && w.col_off % kVec == 0 &&
         reinterpret_cast<uintptr_t>(w.codes) % 16 == 0 && reinterpret_cast<uintptr_t>(x_bf16) % 16 == 0;
}

void launch_fp8_grouped_matmul(const uint16_t* x_bf16, const Fp8MatmulPass* passes, int64_t n_passes, int max_rows,
                               const Fp8Weight& shape, bool vectorised, float* y, cudaStream_t stream) {
  if (shape.N <= 0) return;
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t p0 = 0; p0 < n_passes; p0 += kMaxGridY) {
    const int64_t n = n_passes - p0 < kMaxGridY ? n_passes - p0 : kMaxGridY;
    if (vectorised)
      launch_grouped<true>(x_bf16, passes + p0, n, max_rows, shape, log2_exact(shape.block_cols), y, stream);
    else
      launch_grouped<false>(x_bf16, passes + p0, n, max_rows, shape, -1, y, stream);
  }
}

void launch_fp8_matmul(const uint16_t* x_bf16, int64_t M, const Fp8Weight& w, float* y, cudaStream_t stream) {
  if (M <= 0 || w.N <= 0) return;
  // K == 0 still launches: the outputs are then zeros.
  if (fp8_matmul_vectorised(w, x_bf16))
    launch_all<true>(x_bf16, M, w, log2_exact(w.block_cols), y, stream);
  else
    launch_all<false>(x_bf16, M, w, -1, y, stream);
}

}  // namespace shardlm::cuda
