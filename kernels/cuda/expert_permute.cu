#include "cuda/expert_permute.h"

#include <cstdint>

#include "bf16_bits.h"

namespace shardlm::cuda {

namespace {

constexpr int kPermuteThreads = 512;  // 16 warps: one tile of 512 pairs per step
constexpr int kPermuteWarps = kPermuteThreads / 32;
constexpr int kRowThreads = 256;

// A stable counting sort in one block. Pass 1 counts pairs per expert (shared atomics: the counts
// do not depend on their order). Pass 2 walks the pairs in tiles of one pair per thread, in index
// order; a pair's row is its expert's running base + the pairs of the same expert in earlier
// warps of the tile + those in lower lanes of its own warp, so rows follow (t, j) order.
// The local expert of pair i, or -1 (not local, or a padding row's: pos[i / k] < 0).
__device__ inline int local_expert(const int32_t* topk_ids, const int32_t* pos, int k, int64_t i, int32_t e0, int E) {
  if (pos && pos[i / k] < 0) return -1;
  const int64_t e = static_cast<int64_t>(topk_ids[i]) - e0;
  return e >= 0 && e < E ? static_cast<int>(e) : -1;
}

__global__ void expert_permute_kernel(const int32_t* __restrict__ topk_ids, int64_t P, int k, int32_t e0, int E,
                                      const int32_t* __restrict__ pos, int32_t* __restrict__ offsets,
                                      int32_t* __restrict__ slot_row, int32_t* __restrict__ row_pair,
                                      int64_t* __restrict__ counts) {
  extern __shared__ int shared[];
  int* base = shared;              // [E] next row of each expert
  int* count = base + E;           // [E]
  int* warp_count = count + E;     // [kPermuteWarps][E]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int e = tid; e < E; e += kPermuteThreads) count[e] = 0;
  __syncthreads();
  for (int64_t i = tid; i < P; i += kPermuteThreads) {
    const int e = local_expert(topk_ids, pos, k, i, e0, E);
    if (e >= 0) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (counts)
    for (int e = tid; e < E; e += kPermuteThreads) counts[e] += count[e];
  if (tid == 0) {
    int run = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = run;
      base[e] = run;
      run += count[e];
    }
    offsets[E] = run;
  }
  __syncthreads();

  for (int64_t tile = 0; tile < P; tile += kPermuteThreads) {
    const int64_t i = tile + tid;
    int e = -1;
    if (i < P) {
      e = local_expert(topk_ids, pos, k, i, e0, E);
      if (e < 0) slot_row[i] = -1;
    }
    for (int x = tid; x < kPermuteWarps * E; x += kPermuteThreads) warp_count[x] = 0;
    __syncthreads();
    const unsigned peers = __match_any_sync(0xffffffffu, e);  // lanes of this warp with the same expert
    const int lane_rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0 && lane_rank == 0) warp_count[warp * E + e] = __popc(peers);
    __syncthreads();
    // Per expert: the counts of the warps become exclusive prefixes starting at its base.
    for (int x = tid; x < E; x += kPermuteThreads) {
      int run = base[x];
      for (int w = 0; w < kPermuteWarps; ++w) {
        const int c = warp_count[w * E + x];
        warp_count[w * E + x] = run;
        run += c;
      }
      base[x] = run;
    }
    __syncthreads();
    if (e >= 0) {
      const int r = warp_count[warp * E + e] + lane_rank;
      slot_row[i] = r;
      row_pair[r] = static_cast<int32_t>(i);
    }
    __syncthreads();  // the next tile zeroes warp_count
  }
}

__global__ void expert_gather_kernel(const float* __restrict__ x, int64_t H, int k,
                                     const int32_t* __restrict__ row_pair, const int32_t* __restrict__ num_rows,
                                     int64_t max_rows, float* __restrict__ xp, uint16_t* __restrict__ twin) {
  const int64_t rows = *num_rows < max_rows ? *num_rows : max_rows;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* src = x + static_cast<int64_t>(row_pair[r] / k) * H;
    float* dst = xp + r * H;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      const float v = src[c];
      dst[c] = v;
      if (twin) twin[r * H + c] = bf16_bits::from_f32(v);  // null or not for the whole launch
    }
  }
}

// Y: float rows, or bf16 ones widened exactly.
template <typename Y>
__global__ void expert_combine_kernel(const Y* __restrict__ yp, int64_t H, const int32_t* __restrict__ topk_ids,
                                      const float* __restrict__ topk_w, const int32_t* __restrict__ slot_row, int64_t T,
                                      int k, float* __restrict__ out) {
  extern __shared__ int shared[];
  int* rows = shared;                                  // [k] rows of the local slots, ascending expert id
  float* w = reinterpret_cast<float*>(rows + k);       // [k] their weights
  __shared__ int n_local;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    if (threadIdx.x == 0) {
      const int32_t* ids = topk_ids + t * k;
      int n = 0;
      int last = -1;  // slot taken last; slots are taken by ascending (id, slot)
      for (;;) {
        int pick = -1;
        for (int j = 0; j < k; ++j) {
          if (slot_row[t * k + j] < 0) continue;
          const bool after_last = last < 0 || ids[j] > ids[last] || (ids[j] == ids[last] && j > last);
          if (after_last && (pick < 0 || ids[j] < ids[pick])) pick = j;
        }
        if (pick < 0) break;
        rows[n] = slot_row[t * k + pick];
        w[n] = topk_w[t * k + pick];
        ++n;
        last = pick;
      }
      n_local = n;
    }
    __syncthreads();
    const int n = n_local;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) acc = acc + w[i] * bf16_bits::widen(yp[static_cast<int64_t>(rows[i]) * H + c]);
      out[t * H + c] = acc;
    }
    __syncthreads();  // rows, w and n_local are rewritten for the next token
  }
}

int grid_for(int64_t n) { return static_cast<int>(n < 65535 * 16 ? n : 65535 * 16); }

}  // namespace

void launch_expert_permute(const int32_t* topk_ids, int64_t T, int k, int32_t e0, int E, const int32_t* pos,
                           int32_t* offsets, int32_t* slot_row, int32_t* row_pair, int64_t* counts,
                           cudaStream_t stream) {
  if (E <= 0) return;
  const int64_t P = T * k;
  if (P <= 0) {
    cudaMemsetAsync(offsets, 0, static_cast<size_t>(E + 1) * sizeof(int32_t), stream);
    return;
  }
  const size_t smem = static_cast<size_t>(2 + kPermuteWarps) * E * sizeof(int);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(expert_permute_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  expert_permute_kernel<<<1, kPermuteThreads, smem, stream>>>(topk_ids, P, k, e0, E, pos, offsets, slot_row, row_pair,
                                                              counts);
}

void launch_expert_gather(const float* x, int64_t H, int k, const int32_t* row_pair, const int32_t* num_rows,
                          int64_t max_rows, float* xp, uint16_t* twin, cudaStream_t stream) {
  if (H <= 0 || max_rows <= 0 || k <= 0) return;
  expert_gather_kernel<<<grid_for(max_rows), kRowThreads, 0, stream>>>(x, H, k, row_pair, num_rows, max_rows, xp, twin);
}

void launch_expert_combine(const float* yp, int64_t H, const int32_t* topk_ids, const float* topk_w,
                           const int32_t* slot_row, int64_t T, int k, float* out, cudaStream_t stream) {
  if (H <= 0 || T <= 0 || k <= 0) return;
  const size_t smem = static_cast<size_t>(k) * (sizeof(int) + sizeof(float));
  expert_combine_kernel<float>
      <<<grid_for(T), kRowThreads, smem, stream>>>(yp, H, topk_ids, topk_w, slot_row, T, k, out);
}

void launch_expert_combine_bf16(const uint16_t* yp, int64_t H, const int32_t* topk_ids, const float* topk_w,
                                const int32_t* slot_row, int64_t T, int k, float* out, cudaStream_t stream) {
  if (H <= 0 || T <= 0 || k <= 0) return;
  const size_t smem = static_cast<size_t>(k) * (sizeof(int) + sizeof(float));
  expert_combine_kernel<uint16_t>
      <<<grid_for(T), kRowThreads, smem, stream>>>(yp, H, topk_ids, topk_w, slot_row, T, k, out);
}

}  // namespace shardlm::cuda
