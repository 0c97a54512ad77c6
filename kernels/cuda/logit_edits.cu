#include "cuda/logit_edits.h"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 256;

// Grid: x over the vocabulary, y over the rows; a row without allowed_only is left as it is.
__global__ void __launch_bounds__(kThreads)
    bar_rows_kernel(float* __restrict__ edited, int64_t R, int64_t V, const SamplingRow* __restrict__ params) {
  for (int64_t r = blockIdx.y; r < R; r += gridDim.y) {
    if (!params[r].allowed_only) continue;
    float* row = edited + r * V;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < V;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
      row[i] = -INFINITY;
  }
}

// One thread an entry: entries name distinct logits, so no two threads write one.
__global__ void __launch_bounds__(kThreads)
    apply_logit_edits_kernel(const float* __restrict__ logits, float* __restrict__ edited, int64_t V,
                             const SamplingRow* __restrict__ params, const LogitEditEntry* __restrict__ entries,
                             int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const LogitEditEntry e = entries[i];
    const SamplingRow& p = params[e.row];
    const int64_t at = static_cast<int64_t>(e.row) * V + e.token;
    sampling::TokenEdit edit;
    edit.token = e.token;
    edit.output_count = e.output_count;
    edit.bias = e.bias;
    edit.allowed = e.allowed;
    edited[at] = sampling::edited_logit(logits[at], edit, p.allowed_only != 0, p.repetition_penalty,
                                        p.frequency_penalty, p.presence_penalty);
  }
}

}  // namespace

void launch_apply_logit_edits(const float* logits, float* edited, int64_t R, int64_t V, const SamplingRow* params,
                              const LogitEditEntry* entries, int64_t n, bool any_allowed_only, cudaStream_t stream) {
  if (any_allowed_only && R > 0) {
    const int64_t blocks = (V + kThreads - 1) / kThreads;
    const dim3 grid(static_cast<unsigned>(blocks < 1024 ? blocks : 1024), static_cast<unsigned>(R < 65535 ? R : 65535));
    bar_rows_kernel<<<grid, kThreads, 0, stream>>>(edited, R, V, params);
  }
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  apply_logit_edits_kernel<<<static_cast<int>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(
      logits, edited, V, params, entries, n);
}

}  // namespace shardlm::cuda
