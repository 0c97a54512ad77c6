// A warp computes kRowsPerWarp outputs n for up to MT activation rows: each lane walks K in 16-weight
// steps (or one weight per step on the general path), dequantising each fp8 code once for all MT
// rows. bf16 and fp32 weights (the device-routed grouped call) take the same loops and sum order.
//
// Dequantisation on the conversion instructions Ada and Hopper have for it (convert_pairs.cuh): a
// pair of codes to fp32 exactly, times the block scale in fp32 (rounded once, as the host rounds
// it), and the pair rounded to bf16 in one instruction, as the host's bf16 rounding gives it; no
// step is special (no NaN or scale test).
// The integer form this replaced (codes placed in fp32 bits at 2^-120, rounded to bf16 by integer
// adds, a NaN and scale test per step) bounded the kernel on the integer pipe: 62 us for
// 1 x 8192 x 8192 on an H200, whose HBM streams those weights in 14. sm_90a SASS of the 1-row
// loop per 32 weights: 444 instructions, 265 of them on the integer pipe, before; 230 and 68 now.
// fp32 subnormals must not be flushed: the kernels build without fast math.
#include "cuda/rows_matmul.h"

#include <cstdint>
#include <cstring>

#include "cuda/convert_pairs.cuh"
#include "cuda/warp_exchange.cuh"
#include "fp8_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 2;
constexpr int kThreads = kWarps * 32;
// Six blocks of 128 threads per SM: at most 80 registers a thread (65536 / 768 = 85, allocated in
// 8s), which the widest variants (8 rows, 16-byte path) fit without spilling.
constexpr int kMinBlocks = 6;
constexpr int kVec = 16;  // codes per lane and step on the 16-byte path
constexpr int kMaxRows = static_cast<int>(kFp8MatmulRowsPerPass);

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

__device__ inline float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ inline float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }

// a and b rounded to bf16 (nearest even; NaN stays NaN), widened back: as a pair in one conversion
// (kPacked), or each by integer adds, a NaN left as it is (the adds would carry the GPU's NaN,
// 0x7fffffff, into the sign).
template <bool kPacked>
__device__ inline void round_bf16x2(float& a, float& b) {
  if (kPacked) {
    const uint32_t p = detail::f32x2_to_bf16x2(a, b);
    a = bf16_lo(p);
    b = bf16_hi(p);
    return;
  }
  if (!isnan(a)) a = round_bf16(a);
  if (!isnan(b)) b = round_bf16(b);
}

// The four codes of a word (the lowest byte first) as the weights the host gives them with scale s.
template <bool kPacked>
__device__ inline void dequant4(uint32_t word, float s, float* w) {
  detail::e4m3x2_to_f32(word, w[0], w[1]);
  detail::e4m3x2_to_f32(word >> 16, w[2], w[3]);
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] *= s;
  round_bf16x2<kPacked>(w[0], w[1]);
  round_bf16x2<kPacked>(w[2], w[3]);
}

// Four bf16 pairs as 8 fp32 values.
__device__ inline void widen_bf16x8(const Words4& a, float* v) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = bf16_lo(a.w[j]);
    v[2 * j + 1] = bf16_hi(a.w[j]);
  }
}

__device__ inline void widen_f32x4(const Words4& a, float* v) {
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = __uint_as_float(a.w[j]);
}

// kVec consecutive activations of one row from k, as fp32.
template <RowsWeight F>
__device__ inline void load_x16(const void* x, int64_t at, float* xv) {
  if (F == RowsWeight::kF32) {
    const float* p = static_cast<const float*>(x) + at;
#pragma unroll
    for (int q = 0; q < 4; ++q) widen_f32x4(load16(p + 4 * q), xv + 4 * q);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(x) + at;
    widen_bf16x8(load16(p), xv);
    widen_bf16x8(load16(p + 8), xv + 8);
  }
}

template <RowsWeight F>
__device__ inline float load_x1(const void* x, int64_t at) {
  if (F == RowsWeight::kF32) return static_cast<const float*>(x)[at];
  return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[at]) << 16);
}

// kVec consecutive weights of one output row from (row_at + k): fp8 codes dequantised with scale s
// (kPacked: round_bf16x2's two ways).
template <RowsWeight F, bool kPacked>
__device__ inline void load_w16(const void* w, int64_t at, float s, float* wv) {
  if (F == RowsWeight::kFp8) {
    const Words4 c = load16(static_cast<const uint8_t*>(w) + at);
#pragma unroll
    for (int j = 0; j < 4; ++j) dequant4<kPacked>(c.w[j], s, wv + 4 * j);
  } else if (F == RowsWeight::kBf16) {
    const uint16_t* p = static_cast<const uint16_t*>(w) + at;
    widen_bf16x8(load16(p), wv);
    widen_bf16x8(load16(p + 8), wv + 8);
  } else {
    const float* p = static_cast<const float*>(w) + at;
#pragma unroll
    for (int q = 0; q < 4; ++q) widen_f32x4(load16(p + 4 * q), wv + 4 * q);
  }
}

template <RowsWeight F>
__device__ inline float load_w1(const void* w, int64_t at, float s) {
  if (F == RowsWeight::kFp8) return weight_exact(static_cast<const uint8_t*>(w)[at], s);
  if (F == RowsWeight::kBf16) return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(w)[at]) << 16);
  return static_cast<const float*>(w)[at];
}

// How a block finds its rows and weight.
enum class PassSource {
  kRows,    // blockIdx.y * kMaxRows of the one weight
  kList,    // passes[blockIdx.y], a list the host wrote
  kRouted,  // passes[pass0 + blockIdx.y] below *n_passes, a list the device wrote
};

// Grid: x covers N in kWarps * kRowsPerWarp outputs per block, y the passes (see PassSource).
template <int MT, bool kVectorised, PassSource kSource, RowsWeight F>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    rows_matmul_kernel(const void* __restrict__ x, int64_t M, const void* __restrict__ weight,
                       const float* __restrict__ scale_inv, int64_t N, int64_t K, int64_t scale_cols,
                       int64_t block_rows, int64_t block_cols, int block_cols_log2, int64_t row_off, int64_t col_off,
                       float* __restrict__ y, const Fp8MatmulPass* __restrict__ passes, int64_t pass0,
                       const int32_t* __restrict__ n_passes) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  int64_t m0;
  int rows;
  if (kSource == PassSource::kRows) {
    m0 = static_cast<int64_t>(blockIdx.y) * kMaxRows;
    rows = static_cast<int>(M - m0 < MT ? M - m0 : MT);
  } else {
    const int64_t pi = pass0 + blockIdx.y;
    if (kSource == PassSource::kRouted && pi >= *n_passes) return;  // the whole block: no barrier follows
    const Fp8MatmulPass p = passes[pi];
    weight = p.weight;
    scale_inv = p.scale_inv;
    m0 = p.row0;
    rows = p.rows < MT ? p.rows : MT;
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
    srow[r] = F == RowsWeight::kFp8 ? ((nrow[r] + row_off) / block_rows) * scale_cols : 0;
  }

  if (kVectorised) {
    // Up to 4 activation rows the weights are rounded to bf16 in pairs by one conversion; at 8, by
    // integer adds: there ptxas keeps the converted pairs rather than the widened weights and
    // widens them again for every activation row. sm_90a SASS, instructions per 32 weights with
    // the conversion / the adds: 1 row 230 / 340, 4 rows 498 / 516, 8 rows 853 / 741.
    constexpr bool kPackedRound = MT <= 4;
    for (int64_t k = static_cast<int64_t>(lane) * kVec; k < K; k += 32 * kVec) {
      // Both rows' weights first, then one activation row at a time: 2 x 16 weights and 16
      // activations live at once, whatever MT (registers, so occupancy, do not grow with it).
      const int64_t sblock = F == RowsWeight::kFp8 ? (k + col_off) >> block_cols_log2 : 0;
      float wv[kRowsPerWarp][kVec];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        load_w16<F, kPackedRound>(weight, nrow[r] * K + k, F == RowsWeight::kFp8 ? scale_inv[srow[r] + sblock] : 1.0f,
                                  wv[r]);
      int64_t xat = m0 * K + k;  // stepped row to row: ptxas multiplied afresh for every row
#pragma unroll
      for (int m = 0; m < MT; ++m, xat += K) {
        if (m >= rows) continue;  // a row past the pass: its sums are never written
        float xv[kVec];
        load_x16<F>(x, xat, xv);
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
      for (int m = 0; m < MT; ++m) xv[m] = m < rows ? load_x1<F>(x, (m0 + m) * K + k) : 0.0f;
      const int64_t sblock = F == RowsWeight::kFp8 ? (k + col_off) / block_cols : 0;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float wv =
            load_w1<F>(weight, nrow[r] * K + k, F == RowsWeight::kFp8 ? scale_inv[srow[r] + sblock] : 1.0f);
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(wv, xv[m], acc[r][m]);
      }
    }
  }

  // Every sum at once (the butterfly's bits for each): one exchange per step for all of them.
  float sums[kRowsPerWarp * MT];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) sums[r * MT + m] = acc[r][m];
  warp_butterfly_n<FaddOp>(sums);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (lane == r * MT + m && n0 + r < N && m < rows) y[(m0 + m) * N + n0 + r] = sums[r * MT + m];
}

// The device-routed pass list: group g's rows [offsets[g], offsets[g + 1]) in passes of up to
// kMaxRows, groups in order, written from an exclusive scan of the groups' pass counts.
constexpr int kPassThreads = 256;

__global__ void __launch_bounds__(kPassThreads)
    routed_passes_kernel(const int32_t* __restrict__ offsets, int64_t G, const RoutedWeight* __restrict__ weights,
                         Fp8MatmulPass* __restrict__ passes, int32_t* __restrict__ n_passes) {
  __shared__ int32_t scan[kPassThreads];
  __shared__ int32_t base;
  const int tid = threadIdx.x;
  if (tid == 0) base = 0;
  __syncthreads();
  for (int64_t g0 = 0; g0 < G; g0 += kPassThreads) {
    const int64_t g = g0 + tid;
    int32_t lo = 0, hi = 0;
    if (g < G) {
      lo = offsets[g];
      hi = offsets[g + 1];
    }
    const int32_t np = hi > lo ? (hi - lo + kMaxRows - 1) / kMaxRows : 0;
    scan[tid] = np;
    __syncthreads();
    for (int off = 1; off < kPassThreads; off <<= 1) {  // inclusive scan (Hillis-Steele)
      const int32_t v = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] += v;
      __syncthreads();
    }
    const int32_t first = base + scan[tid] - np;
    for (int32_t p = 0; p < np; ++p) {
      const int32_t r0 = lo + p * kMaxRows;
      passes[first + p] =
          Fp8MatmulPass{weights[g].weight, weights[g].scale_inv, r0, hi - r0 < kMaxRows ? hi - r0 : kMaxRows};
    }
    __syncthreads();  // every thread has read base
    if (tid == kPassThreads - 1) base += scan[tid];
    __syncthreads();
  }
  if (tid == 0) *n_passes = base;
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return (int64_t{1} << l) == v ? l : -1;
}

template <int MT, bool kVectorised, PassSource kSource = PassSource::kRows, RowsWeight F = RowsWeight::kFp8>
void launch_pass(const void* x, int64_t M, const Fp8Weight& w, int bc_log2, unsigned passes, float* y,
                 cudaStream_t stream, const Fp8MatmulPass* pass_list = nullptr, int64_t pass0 = 0,
                 const int32_t* n_passes = nullptr) {
  const int64_t per_block = kWarps * kRowsPerWarp;
  const dim3 grid(static_cast<unsigned>((w.N + per_block - 1) / per_block), passes);
  rows_matmul_kernel<MT, kVectorised, kSource, F>
      <<<grid, kThreads, 0, stream>>>(x, M, w.codes, w.scale_inv, w.N, w.K, w.scale_cols, w.block_rows, w.block_cols,
                                      bc_log2, w.row_off, w.col_off, y, pass_list, pass0, n_passes);
}

template <bool kVectorised>
void launch_grouped(const uint16_t* x, const Fp8MatmulPass* passes, int64_t n_passes, int max_rows, const Fp8Weight& w,
                    int bc_log2, float* y, cudaStream_t stream) {
  const auto n = static_cast<unsigned>(n_passes);
  constexpr PassSource kList = PassSource::kList;
  if (max_rows <= 1)
    launch_pass<1, kVectorised, kList>(x, 0, w, bc_log2, n, y, stream, passes);
  else if (max_rows <= 2)
    launch_pass<2, kVectorised, kList>(x, 0, w, bc_log2, n, y, stream, passes);
  else if (max_rows <= 4)
    launch_pass<4, kVectorised, kList>(x, 0, w, bc_log2, n, y, stream, passes);
  else
    launch_pass<8, kVectorised, kList>(x, 0, w, bc_log2, n, y, stream, passes);
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

// The routed matmul's launches: the pass count is known on the device only, so every block takes
// up to kMaxRows rows (MT = kMaxRows) and the grid covers the most passes, in chunks of the grid's
// y limit.
template <bool kVectorised, RowsWeight F>
void launch_routed(const void* x, const Fp8Weight& w, int bc_log2, int64_t max_passes, const Fp8MatmulPass* passes,
                   const int32_t* n_passes, float* y, cudaStream_t stream) {
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t p0 = 0; p0 < max_passes; p0 += kMaxGridY) {
    const int64_t n = max_passes - p0 < kMaxGridY ? max_passes - p0 : kMaxGridY;
    launch_pass<kMaxRows, kVectorised, PassSource::kRouted, F>(x, 0, w, bc_log2, static_cast<unsigned>(n), y, stream,
                                                               passes, p0, n_passes);
  }
}

template <RowsWeight F>
void launch_routed_format(const void* x, const Fp8Weight& w, bool vectorised, int64_t max_passes,
                          const Fp8MatmulPass* passes, const int32_t* n_passes, float* y, cudaStream_t stream) {
  const int bc_log2 = F == RowsWeight::kFp8 && vectorised ? log2_exact(w.block_cols) : -1;
  if (vectorised)
    launch_routed<true, F>(x, w, bc_log2, max_passes, passes, n_passes, y, stream);
  else
    launch_routed<false, F>(x, w, bc_log2, max_passes, passes, n_passes, y, stream);
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

bool routed_matmul_vectorised(const Fp8Weight& shape, RowsWeight format, const void* weight, const void* x) {
  if (format == RowsWeight::kFp8) {
    Fp8Weight w = shape;
    w.codes = static_cast<const uint8_t*>(weight);
    return fp8_matmul_vectorised(w, static_cast<const uint16_t*>(x));
  }
  return shape.K % kVec == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

int64_t routed_matmul_max_passes(int64_t max_rows, int64_t G) {
  // Group g takes ceil(r_g / kMaxRows) <= (r_g + kMaxRows - 1) / kMaxRows passes; summed over G.
  return (max_rows + G * (kMaxRows - 1)) / kMaxRows;
}

void launch_routed_matmul(const void* x, int64_t max_rows, const int32_t* offsets, int64_t G,
                          const RoutedWeight* weights, const Fp8Weight& shape, RowsWeight format, bool vectorised,
                          Fp8MatmulPass* passes, int32_t* n_passes, float* y, cudaStream_t stream) {
  if (shape.N <= 0 || G <= 0 || max_rows <= 0) return;
  routed_passes_kernel<<<1, kPassThreads, 0, stream>>>(offsets, G, weights, passes, n_passes);
  const int64_t max_passes = routed_matmul_max_passes(max_rows, G);
  switch (format) {
    case RowsWeight::kFp8:
      launch_routed_format<RowsWeight::kFp8>(x, shape, vectorised, max_passes, passes, n_passes, y, stream);
      break;
    case RowsWeight::kBf16:
      launch_routed_format<RowsWeight::kBf16>(x, shape, vectorised, max_passes, passes, n_passes, y, stream);
      break;
    case RowsWeight::kF32:
      launch_routed_format<RowsWeight::kF32>(x, shape, vectorised, max_passes, passes, n_passes, y, stream);
      break;
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
