// The attention op alone, for shardlm bench, at the model's head shape (GQA, or MLA on the latent
// cache) with a cache of random rows, fp32, bf16 and fp8 in turn (--kv-dtype):
//  - decode on long contexts: microseconds per call and the rate the K/V cache is read at, beside
//    the memory bandwidth (GQA decode attention reads every cached row once per step, so the
//    bandwidth is its ceiling); for MLA, whose heads all score each latent row, also GFLOP/s
//    beside the peak of the units that ran them, which can bind first;
//  - prefill chunks (the tokens of one sequence in one call, each attending to its prefix):
//    microseconds and GFLOP/s of the scores and the weighted sums, beside the peak of the units
//    that ran them (a chunk's tokens share its rows, so arithmetic is its ceiling): the bf16 tensor
//    peak where the backend attends on tensor cores (--prefill-attention bf16), with the fp32
//    kernels' figures beside it, else the fp32 peak.
#pragma once

#include "compute/backend.h"
#include "model/model_spec.h"

namespace shardlm {

// Decode: 1 and 8 sequences at 4096 and at longest_context cached positions. On CUDA each is
// timed twice: as the backend launches it (split along the positions when the step is short of
// work) and forced unsplit (no bound on the positions), so one run shows what the split gains.
// An MLA model's decode on bf16 tensor cores (--decode-attention bf16) is also timed on the fp32
// kernel.
// Prefill: one chunk of 512 tokens, as a whole prompt and at the end of a 4096-position one; on
// CUDA with prefill attention on bf16 tensor cores, also timed with it off (the fp32 tiled
// kernel), and when the backend tiles the chunk's tokens in fp32, with the per-token kernel too
// (tables without their host copies). A longest_context under 4096 (or 512) caps those too.
// A peak <= 0: not known (no percentage printed).
struct AttentionPeaks {
  double fp32_gflops = 0;  // the CUDA cores' (or the CPU's FMA) peak
  double bf16_gflops = 0;  // the bf16 tensor cores' (0: none)
};
void print_attention_bench(ComputeBackend& b, const ModelSpec& spec, double bw_gbs, const AttentionPeaks& peaks,
                           int64_t longest_context = 32768);

}  // namespace shardlm
