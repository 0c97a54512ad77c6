// Whole-row scans of a logits row for the host sampler: the greedy choice and one token's
// log-probability. Each reads the row a few times at vector width (about 32000 logits in
// microseconds), where a call of libm's exp per logit took about 100 us a row.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// The index of the largest logit, ties to the lowest index. NaN logits are never chosen; a row of
// NaN only gives 0. With row_max, also the largest logit itself (-inf for a row of NaN), exactly
// what log_softmax_at takes as the row's maximum.
int64_t argmax_logit(const float* x, int64_t n, float* row_max = nullptr);

// log_softmax(x)[i] = x[i] - max - log(sum_j exp(x[j] - max)): an fp32 max, each exponential in
// fp32 (exp16, within 1 ulp) and their sum in fp64, so the result is within a few 1e-8 of the
// exact value whatever the row's length.
float log_softmax_at(const float* x, int64_t n, int64_t i);
// The same with the row's maximum already known (argmax_logit's row_max): one read of the row
// fewer, the same bits.
float log_softmax_at(const float* x, int64_t n, int64_t i, float row_max);

// The temperature sampler's unnormalised probabilities over candidates in order: probs[j] =
// float(exp((x[order[j]] - top) / T)) with the exponent in double (exp8d), as the CUDA sampler
// computes them; returns their sum in double (8 lanes, then a fixed tree). inv_t = 1 / T.
double temperature_probs(const float* x, const int32_t* order, int64_t n, double top, double inv_t, float* probs);

}  // namespace shardlm::cpu
