// One warp per (token, head), lanes over the dims; the states are read once, in partition order.
#include "cuda/attention_combine.h"

#include "cuda/attention_partitions.h"
#include "cuda/attention_util.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kMaxWidth = 512;
constexpr int kPerLane = kMaxWidth / 32;
constexpr int kWarps = 8;

__global__ void __launch_bounds__(kWarps * 32)
    attention_combine_kernel(int64_t T, int64_t n_heads, int width, const int32_t* pos, int64_t window, int64_t parts,
                             const float* states, float* out, uint16_t* twin) {
  const int lane = threadIdx.x & 31;
  const int64_t th = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // t * n_heads + h
  if (th >= T * n_heads) return;
  const int64_t n = attention_partitions(pos[th / n_heads], window);
  if (n < 2) return;  // the attention kernel wrote this one
  const int64_t stride = width + 2;
  const float* st = states + th * parts * stride;
  // A partition's state is loaded while the one before it is merged: the loads do not depend on
  // the running state, and one at a time they put an L2 round trip per partition in the warp's path.
  struct State {
    float m, l, acc[kPerLane];
  };
  auto load = [&](int64_t k, State& s) {
    const float* p = st + k * stride;
    s.m = p[0];
    s.l = p[1];
#pragma unroll
    for (int a = 0; a < kPerLane; ++a) {
      const int d = lane + 32 * a;
      s.acc[a] = d < width ? p[2 + d] : 0.0f;
    }
  };
  State run, next;
  load(0, run);  // the first partition is the state as it is
  load(1, next);
  float M = run.m, L = run.l;
  for (int64_t k = 1; k < n; ++k) {
    const State cur = next;
    if (k + 1 < n) load(k + 1, next);
    const detail::MergeScale c = detail::merge_scale(M, cur.m);
    M = c.max;
    L = detail::merge_value(L, cur.l, c);
#pragma unroll
    for (int a = 0; a < kPerLane; ++a) {
      const int d = lane + 32 * a;
      if (d < width) run.acc[a] = detail::merge_value(run.acc[a], cur.acc[a], c);
    }
  }
  detail::warp_write_normalised(out + th * width, width, L, run.acc, twin ? twin + th * width : nullptr);
}

}  // namespace

void attention_combine(int64_t T, int64_t n_heads, int64_t width, const int32_t* pos, int64_t window, int64_t parts,
                       const float* states, float* out, uint16_t* twin, cudaStream_t stream) {
  if (T <= 0 || n_heads <= 0 || width <= 0 || parts < 2) return;
  const int64_t warps = T * n_heads;
  attention_combine_kernel<<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(
      T, n_heads, static_cast<int>(width), pos, window, parts, states, out, twin);
}

}  // namespace shardlm::cuda
