#include "cuda/penalties.h"

#include "sample_rules.h"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 256;

// One thread an entry: entries name distinct logits, so no two threads write one.
__global__ void __launch_bounds__(kThreads)
    apply_penalties_kernel(float* __restrict__ logits, int64_t V, const SamplingRow* __restrict__ params,
                           const PenaltyEntry* __restrict__ entries, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PenaltyEntry e = entries[i];
    const SamplingRow& p = params[e.row];
    float* x = logits + static_cast<int64_t>(e.row) * V + e.token;
    *x = sampling::penalized_logit(*x, p.repetition_penalty, p.frequency_penalty, p.presence_penalty, e.output_count);
  }
}

}  // namespace

void launch_apply_penalties(float* logits, int64_t V, const SamplingRow* params, const PenaltyEntry* entries, int64_t n,
                            cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  apply_penalties_kernel<<<static_cast<int>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(logits, V, params,
                                                                                                     entries, n);
}

}  // namespace shardlm::cuda
